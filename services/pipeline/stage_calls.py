"""Calls into the model stages: their handles, the failures that mean a stage is gone, and how a
response reports them (a 503 the client may retry)."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from ray.exceptions import ActorUnavailableError, GetTimeoutError, ObjectLostError, RayActorError
from ray.serve.exceptions import DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from services.common.errors import OmniError
from services.extensions.ray.stage_handle import StageHandle
from services.pipeline.stage_deadlines import StageStalled

log = logging.getLogger("ray.serve")
# A stage replica's process died or is unreachable (a handle call raises one of these), its call
# went past its deadline (alive but not answering), or the object a stage left in the object store
# is gone with it or cannot be fetched in time.
STAGE_GONE = (
    RayActorError,
    ActorUnavailableError,
    DeploymentUnavailableError,
    ObjectLostError,
    GetTimeoutError,
    StageStalled,
)


@dataclass
class StageHandles:
    """The stage deployments; calls go over Serve's gRPC transport (SERVE_ENV: throughput-optimized
    mode), each its own request to Serve's router (StageHandle)."""

    video: StageHandle
    encoder: StageHandle
    prefill: StageHandle
    decode: StageHandle
    talker: StageHandle
    vocoder: StageHandle
    # the realtime decode pool, where the profile has one: realtime sessions' turns, pinned
    realtime_decode: StageHandle | None = None

    @classmethod
    def of(cls, *handles: DeploymentHandle | None) -> StageHandles:
        return cls(*(None if h is None else StageHandle(h) for h in handles))


class DecodeDropped(Exception):
    """A decode stream that ended with no finish reason: its engine gave the request up
    (vLLM's `error` or `abort`: services/engine/session_kv.py GAVE_UP) without answering it."""


@contextlib.contextmanager
def stage_calls() -> Iterator[None]:
    """A stage replica that died or cannot be reached, or a decode its engine dropped, is a 503 (gRPC
    UNAVAILABLE): the request may be retried once Serve replaces it. Logged under an id; the client
    gets only the id."""
    try:
        yield
    except (*STAGE_GONE, DecodeDropped) as e:
        error_id = f"err_{uuid.uuid4().hex[:16]}"
        log.error("a stage call failed [%s]", error_id, exc_info=e)
        raise OmniError(
            503,
            f"a model stage is unavailable; retry shortly (error id {error_id})",
            code="stage_unavailable",
            headers={"retry-after": "1"},
        ) from None
