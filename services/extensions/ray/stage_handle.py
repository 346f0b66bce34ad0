"""A stage deployment's handle whose every call is a request of its own to Serve's router, and is
cancelled with the client request it was made for."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

from ray.serve import context as serve_context
from ray.serve.handle import DeploymentHandle


class StageHandle:
    """A stage deployment's handle (`.options(...)`, `.Method.remote(...)`) whose every call is a
    request of its own to Serve's router.

    Serve stamps a call made while serving a client's request with that request's internal id, and
    its router (Ray 2.60) hands a replica to the waiting call of that id. Two calls of one client
    request in flight to one stage at once (a realtime turn's transcription beside its response's
    encoding, on one WebSocket) would share the id: the second would never be handed a replica and
    would wait out its deadline. Each call here gets an id of its own; the request id that logs
    carry is kept, and the call is filed as a child of the client's request (`_follow`), so that
    Serve still cancels it when that request is cancelled (its client went)."""

    def __init__(self, handle: DeploymentHandle):
        self._handle = handle

    def options(self, **kwargs: Any) -> StageHandle:
        return StageHandle(self._handle.options(**kwargs))

    def __getattr__(self, method: str) -> StageHandle:
        if method.startswith("_"):  # not a stage method: copy's and pickle's probes, or no _handle yet
            raise AttributeError(method)
        return StageHandle(getattr(self._handle, method))

    def remote(self, *args: Any, **kwargs: Any):
        parent = serve_context._get_serve_request_context()
        own = dataclasses.replace(parent, _internal_request_id=uuid.uuid4().hex)
        token = serve_context._serve_request_context.set(own)  # read by remote() itself, then restored
        try:
            response = self._handle.remote(*args, **kwargs)
        finally:
            serve_context._serve_request_context.reset(token)
        if parent._internal_request_id:  # made while serving a request
            _follow(parent._internal_request_id, response)
        return response


def _follow(parent_id: str, response: Any) -> None:
    """File a stage call among its client request's in-flight children: when Serve cancels that
    request (its client went: `Replica._on_request_cancelled`), it cancels the call too, wherever
    the pipeline holds it. The entry goes when the call ends; Serve's map is touched only on this
    event loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no event loop to take it out on (not a gateway's call): not filed
        return
    child_id = uuid.uuid4().hex
    serve_context._add_in_flight_request(parent_id, child_id, response)  # Serve calls .cancel()

    def gone(_: Any = None) -> None:
        if not loop.is_closed():  # the replica is not shutting down
            loop.call_soon_threadsafe(serve_context._remove_in_flight_request, parent_id, child_id)

    def assigned(future: Any) -> None:  # the router's answer: a replica's result, or none
        if future.cancelled() or future.exception() is not None:
            gone()
        else:
            future.result().add_done_callback(gone)

    response._replica_result_future.add_done_callback(assigned)
