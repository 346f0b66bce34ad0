"""Chat Completions: POST /v1/chat/completions and omni.v1.Omni/Chat over the pipeline."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from omni.v1 import omni_pb2

from services.common import telemetry
from services.gateway import grpc_wire
from services.gateway.chat import render
from services.gateway.chat.protocol import parse_request
from services.gateway.observer import RequestObserver
from services.gateway.responding import prepared_response
from services.models.profile import Profile
from services.pipeline.pipeline import Pipeline
from services.pipeline.tools import CallDelta, joined


class ChatAPI:
    def __init__(self, profile: Profile, pipeline: Pipeline, observer: RequestObserver):
        self.profile, self.pipeline, self.observer = profile, pipeline, observer

    async def rest(self, request: Request):
        limits = self.profile.limits
        req, prepared, events = await prepared_response(
            request, "rest", "gateway.chat", parse_request, limits, self.pipeline, self.observer
        )
        rid, model, created = prepared.ctx.request_id, self.profile.served_model_name, int(time.time())
        speak, headers = prepared.plan.speak, prepared.headers
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            lines = render.stream(events, rid, model, created, speak, include_usage)
            return StreamingResponse(lines, media_type="text/event-stream", headers=headers)
        completion = await render.whole(events, rid, model, created, speak, prepared.audio_format)
        return JSONResponse(completion, headers=headers)

    async def grpc(self, request: omni_pb2.ChatRequest, grpc_context) -> AsyncIterator[omni_pb2.ChatChunk]:
        arrival = time.perf_counter()
        async with self.observer.grpc_admitting("grpc", "gateway.chat", request, grpc_context) as (
            span,
            tenant,
            metadata,
        ):
            turn = grpc_wire.chat_turn(request, self.profile.limits, metadata)
            prepared = await self.pipeline.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)  # generation's stage spans are children of the request's
        rid, model = prepared.ctx.request_id, self.profile.served_model_name
        deltas: list[CallDelta] = []  # the calls go out whole, before the last chunk
        async for ev in self.observer.events("grpc", self.pipeline.generate(prepared), arrival, span):
            if ev.progress is not None:
                yield omni_pb2.ChatChunk(id=rid, model=model, progress=ev.progress)
            deltas += ev.calls
            if ev.text:
                yield omni_pb2.ChatChunk(id=rid, model=model, text=ev.text)
            if ev.pcm16:
                audio = omni_pb2.AudioDelta(
                    pcm16=ev.pcm16, sample_rate=ev.sample_rate, transcript=ev.transcript or ""
                )
                yield omni_pb2.ChatChunk(id=rid, model=model, audio=audio)
            if ev.finish_reason:
                if deltas:
                    calls = [omni_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                             for c in joined(deltas)]  # fmt: skip
                    yield omni_pb2.ChatChunk(id=rid, model=model, tool_calls=calls)
                yield omni_pb2.ChatChunk(id=rid, model=model, finish_reason=ev.finish_reason, usage=ev.usage)
