"""Deadlines on calls to stage replicas (profile `pipeline.stage_deadlines`). A replica that is alive
but never answers — a deadlocked engine, a stalled transfer, a stopped process that still passes
Serve's health check — must not hold a request, a realtime session or a gRPC stream for ever: Serve's
own request timeout covers REST only, and only at 600 s. A call's reply (or a stream's first item)
must come within `reply_s`, and a stream's next item within `between_s`; past that the call is
cancelled on its replica and the stage counts as gone: the request fails with a 503
`stage_unavailable` (gRPC UNAVAILABLE), or a decode goes on elsewhere like one whose replica died
(Pipeline._decode). Counted in `omniray_gateway_stage_stalls_total{stage, wait}`. A call left any
other way before its end — it failed, or its caller went (a client that left, a response that
failed at another stage) — is cancelled on its replica too, which stops working for nobody."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from services.common.deadline import Overdue, within
from services.extensions.ray.metrics import metric
from services.models.profile import STAGES, StageDeadlinesSpec

log = logging.getLogger("ray.serve")
WAITS = ("reply", "between")


class StageStalled(Exception):
    """A stage call past its deadline; cancelled on its replica."""

    def __init__(self, stage: str, wait: str, after_s: float):
        super().__init__(f"{stage} gave no {wait} within {after_s:g} s")
        self.wait = wait


class StageDeadlines:
    def __init__(self, spec: StageDeadlinesSpec):
        self.reply_s, self.between_s = spec.reply_s, spec.between_s
        self.stalls = metric("omniray_gateway_stage_stalls_total", stage=tuple(STAGES[1:]), wait=WAITS)

    async def reply(self, stage: str, response: Any) -> Any:
        """A unary call's reply (a Serve DeploymentResponse), within `reply_s`."""
        answered = False
        try:
            reply = await within(self.reply_s, response)
            answered = True
            return reply
        except Overdue:
            raise self._stalled(stage, "reply", self.reply_s) from None
        finally:
            if not answered:  # stalled, failed, or its caller cancelled: the replica stops too
                _cancel(stage, response)

    async def stream(
        self, stage: str, responses: Any, reply_s: float | None = None, between_s: float | None = None
    ) -> AsyncIterator[Any]:
        """A streamed call's items (a Serve DeploymentResponseGenerator): the first within `reply_s`,
        each next within `between_s` (the spec's unless given: a stage that waits on another's
        output gets that one's time too)."""
        wait, after_s = "reply", self.reply_s if reply_s is None else reply_s
        ended = False
        try:
            while True:
                try:
                    item = await within(after_s, anext(responses))
                except StopAsyncIteration:
                    ended = True
                    return
                except Overdue:
                    raise self._stalled(stage, wait, after_s) from None
                yield item
                wait, after_s = "between", self.between_s if between_s is None else between_s
        finally:
            if not ended:  # stalled, failed, or its reader gone: the replica stops too
                _cancel(stage, responses)

    def _stalled(self, stage: str, wait: str, after_s: float) -> StageStalled:
        self.stalls.inc(tags={"stage": stage, "wait": wait})
        return StageStalled(stage, wait, after_s)


def _cancel(stage: str, call: Any) -> None:
    """Cancel a Serve call on its replica, best effort (a no-op for one already cancelled)."""
    try:
        call.cancel()
    except Exception:  # a call that cannot be cancelled is left to its replica
        log.debug("cancelling a %s call failed", stage, exc_info=True)
