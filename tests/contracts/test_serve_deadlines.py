"""Contract: a Serve handle call past its deadline (services/pipeline/stage_deadlines.py) ends on
time and is cancelled on its replica — a unary call that never answers, a stream that stops between
items — while a stream that keeps its deadlines is read whole (driven against a real Ray Serve,
2.60)."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from services.models.profile import StageDeadlinesSpec
from services.pipeline.stage_deadlines import StageDeadlines, StageStalled

DEADLINE_S = 1.0
SLACK_S = 2.0  # a handle call's own overhead on two busy cores


@pytest.fixture(scope="module")
def stage():
    from ray import serve

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Stage:
        def __init__(self):
            self.cancelled = 0

        async def _forever(self) -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

        async def stall(self) -> int:
            await self._forever()
            return 0

        async def trickle(self):
            yield 1
            await self._forever()

        async def steady(self):
            for i in range(3):
                await asyncio.sleep(DEADLINE_S / 4)
                yield i

        def seen_cancelled(self) -> int:
            return self.cancelled

    serve.start(proxy_location="Disabled")
    try:
        yield serve.run(Stage.bind(), name="deadline_contract", route_prefix=None)
    finally:
        serve.shutdown()
        if started:
            ray.shutdown()


def test_stalled_calls_end_on_time_and_are_cancelled_on_their_replica(stage):
    deadlines = StageDeadlines(StageDeadlinesSpec(reply_s=DEADLINE_S, between_s=DEADLINE_S))

    async def run() -> None:
        start = time.monotonic()
        with pytest.raises(StageStalled) as stalled:
            await deadlines.reply("decode", stage.stall.remote())
        assert stalled.value.wait == "reply" and time.monotonic() - start < DEADLINE_S + SLACK_S

        items, start = [], time.monotonic()
        with pytest.raises(StageStalled) as stalled:
            async for item in deadlines.stream("decode", stage.options(stream=True).trickle.remote()):
                items.append(item)
        assert items == [1] and stalled.value.wait == "between"
        assert time.monotonic() - start < DEADLINE_S + SLACK_S

        steady = deadlines.stream("decode", stage.options(stream=True).steady.remote())
        assert [item async for item in steady] == [0, 1, 2]

        # both stalled calls stop on the replica (cancellation reaches it asynchronously)
        deadline = time.monotonic() + 30
        while await stage.seen_cancelled.remote() < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await stage.seen_cancelled.remote() == 2

    asyncio.run(run())
