"""A REST request's body, read within the profile's size and time limits."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from services.common.errors import OmniError, too_large
from services.gateway.protocol import parse_body
from services.models.profile import LimitsSpec


async def read_body(request: Request, limits: LimitsSpec) -> bytes:
    limit = limits.max_request_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(f"request body is larger than {limit} bytes", code="request_too_large")
    body = bytearray()
    try:
        async with asyncio.timeout(limits.body_read_timeout_s):
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise too_large(f"request body is larger than {limit} bytes", code="request_too_large")
    except TimeoutError:
        raise OmniError(
            408, f"request body not received within {limits.body_read_timeout_s:g} s", code="request_timeout"
        ) from None
    return bytes(body)


async def read_json(request: Request, limits: LimitsSpec) -> Any:
    return parse_body(await read_body(request, limits))
