"""OpenAI's Responses API: POST /v1/responses over the same pipeline."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from services.gateway.observer import RequestObserver
from services.gateway.responding import prepared_response
from services.gateway.responses.protocol import parse
from services.gateway.responses.render import Rendered
from services.gateway.sse import reported
from services.models.profile import Profile
from services.pipeline.pipeline import Pipeline


class ResponsesAPI:
    def __init__(self, profile: Profile, pipeline: Pipeline, observer: RequestObserver):
        self.profile, self.pipeline, self.observer = profile, pipeline, observer

    async def rest(self, request: Request):
        limits = self.profile.limits
        req, prepared, events = await prepared_response(
            request, "responses", "gateway.responses", parse, limits, self.pipeline, self.observer
        )
        out = Rendered(req, self.profile.served_model_name, prepared.plan.speak, prepared.audio_format)
        if req.stream:
            # headers are gone once it streams: a failure ends it with response.failed
            lines = reported(out.stream(events), "response failed", lambda body: out.failed(body["error"]))
            return StreamingResponse(lines, media_type="text/event-stream", headers=prepared.headers)
        return JSONResponse(await out.whole(events), headers=prepared.headers)
