"""What Chat Completions and Responses share: a REST request admitted (its tenant, from its key),
parsed with the routing headers into a Turn, prepared by the pipeline, and its events measured."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request

from services.common import telemetry
from services.gateway.body import read_body
from services.gateway.grpc_wire import SESSION_HEADER, SLO_HEADER
from services.gateway.observer import RequestObserver
from services.gateway.protocol import parse_body
from services.models.profile import LimitsSpec
from services.pipeline.events import Event
from services.pipeline.pipeline import Pipeline
from services.pipeline.prepared import Prepared
from services.pipeline.turn import Turn

INLINE_PARSE_BYTES = 256 * 1024


async def prepared_response(
    request: Request,
    api_name: str,
    op: str,
    parse: Callable[..., tuple[Any, Turn]],
    limits: LimitsSpec,
    pipeline: Pipeline,
    observer: RequestObserver,
) -> tuple[Any, Prepared, AsyncIterator[Event]]:
    """(the parsed request, the prepared turn, its events measured under `api_name`; `op`: the root
    span's name); every client error (key, body, validation, quota) is raised here, before a
    response byte."""
    arrival = time.perf_counter()
    async with observer.admitting(api_name, op, request.headers) as (span, tenant):
        body = await read_body(request, limits)

        def parsed() -> tuple[Any, Turn]:
            routing = {"session": request.headers.get(SESSION_HEADER, ""),
                       "slo_class": request.headers.get(SLO_HEADER, "")}  # fmt: skip
            return parse(parse_body(body), limits, **routing)

        # A body carrying media is parsed off the event loop: its JSON, base64 and the media's
        # header checks (a clip's packets are demuxed, a PDF is opened) take milliseconds to
        # hundreds of them, which every other request and realtime session on this replica would wait.
        req, turn = parsed() if len(body) <= INLINE_PARSE_BYTES else await asyncio.to_thread(parsed)
        prepared = await pipeline.prepare(turn, tenant)
        telemetry.inject(prepared.ctx)  # generation's stage spans are children of the request's
    return req, prepared, observer.events(api_name, pipeline.generate(prepared), arrival, span)
