"""OpenAI's Responses API: POST /v1/responses over the same pipeline."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from services.common import telemetry
from services.gateway.body import read_json
from services.gateway.grpc_wire import SESSION_HEADER, SLO_HEADER
from services.gateway.observer import RequestObserver
from services.gateway.responses.protocol import parse
from services.gateway.responses.render import Rendered
from services.gateway.sse import reported
from services.models.profile import Profile
from services.pipeline.pipeline import Pipeline


class ResponsesAPI:
    def __init__(self, profile: Profile, pipeline: Pipeline, observer: RequestObserver):
        self.profile, self.pipeline, self.observer = profile, pipeline, observer

    async def rest(self, request: Request):
        arrival = time.perf_counter()
        async with self.observer.admitting("responses", "gateway.responses", request.headers) as (
            span,
            tenant,
        ):
            req, turn = parse(
                await read_json(request, self.profile.limits),
                self.profile.limits,
                session=request.headers.get(SESSION_HEADER, ""),
                slo_class=request.headers.get(SLO_HEADER, ""),
            )
            prepared = await self.pipeline.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)
        events = self.observer.events("responses", self.pipeline.generate(prepared), arrival, span)
        out = Rendered(req, self.profile.served_model_name, prepared.plan.speak, prepared.audio_format)
        if req.stream:
            # headers are gone once it streams: a failure ends it with response.failed
            lines = reported(out.stream(events), "response failed", lambda body: out.failed(body["error"]))
            return StreamingResponse(lines, media_type="text/event-stream", headers=prepared.lease.headers)
        return JSONResponse(await out.whole(events), headers=prepared.lease.headers)
