"""A stage deployment's handle whose every call is a request of its own to Serve's router."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from ray.serve.context import _get_serve_request_context, _serve_request_context
from ray.serve.handle import DeploymentHandle


class StageHandle:
    """A stage deployment's handle (`.options(...)`, `.Method.remote(...)`) whose every call is a
    request of its own to Serve's router.

    Serve stamps a call made while serving a client's request with that request's internal id, and
    its router (Ray 2.60) hands a replica to the waiting call of that id. Two calls of one client
    request in flight to one stage at once (a realtime turn's transcription beside its response's
    encoding, on one WebSocket) would share the id: the second would never be handed a replica and
    would wait out its deadline. Each call here gets an id of its own; the request id that logs
    carry is kept. Serve then no longer cancels the call with its client's request: the pipeline
    cancels its own calls when their reader goes (services/pipeline/stage_deadlines.py)."""

    def __init__(self, handle: DeploymentHandle):
        self._handle = handle

    def options(self, **kwargs: Any) -> StageHandle:
        return StageHandle(self._handle.options(**kwargs))

    def __getattr__(self, method: str) -> StageHandle:
        if method.startswith("_"):  # not a stage method: copy's and pickle's probes, or no _handle yet
            raise AttributeError(method)
        return StageHandle(getattr(self._handle, method))

    def remote(self, *args: Any, **kwargs: Any):
        ctx = _get_serve_request_context()
        own = dataclasses.replace(ctx, _internal_request_id=uuid.uuid4().hex)
        token = _serve_request_context.set(own)  # read by remote() itself, then restored
        try:
            return self._handle.remote(*args, **kwargs)
        finally:
            _serve_request_context.reset(token)
