"""The speech stages' urgency gate: slots bound concurrency, the most urgent waiting step goes next,
and a cancelled waiter never keeps a slot."""

from __future__ import annotations

import asyncio
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from services.playback.board import BoardView
from services.policies import urgency
from services.stages.urgency_gate import UrgencyGate


def _view(session: str, buffered_ms: float, first_audio: bool = True) -> BoardView:
    return BoardView(session_id=session, buffered_ms=buffered_ms, played_ms=0.0, playing=first_audio,
                     speaking=False, responding=True, first_audio=first_audio, barge_ins=0, responses=1,
                     reply_gap_ms=None, ms_per_token=None, age_s=0.0, at=time.time())  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(slots=st.integers(1, 4), steps=st.integers(1, 12), cancel=st.sets(st.integers(0, 11)))
def test_slots_bound_concurrency_and_cancelled_waiters_free_nothing(slots, steps, cancel):
    async def run():
        gate = UrgencyGate(urgency.create("liveserve", {}), dict, slots)
        running, peak, finished = 0, 0, []

        async def step(k):
            nonlocal running, peak
            async with gate.step(f"s{k}"):
                running += 1
                peak = max(peak, running)
                try:
                    await asyncio.sleep(0.001)
                finally:
                    running -= 1
            finished.append(k)

        tasks = [asyncio.create_task(step(k)) for k in range(steps)]
        await asyncio.sleep(0)
        for k in cancel & set(range(steps)):
            tasks[k].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return gate, peak, finished

    gate, peak, finished = asyncio.run(run())
    assert peak <= slots
    assert gate.busy == 0 and not gate.waiting
    # Every step that was not cancelled ran (the first `slots` started before any cancel).
    assert set(range(steps)) - cancel <= set(finished)


def _order(policy: str, views: dict) -> list[str]:
    """One step holds the only slot while three arrive (a well-buffered session, no session, one about
    to run dry); the order in which they then get it."""

    async def run():
        gate = UrgencyGate(urgency.create(policy, {}), lambda: views, 1)
        order = []
        release = asyncio.Event()

        async def holder():
            async with gate.step("first"):
                await release.wait()

        async def step(session):
            async with gate.step(session):
                order.append(session)

        first = asyncio.create_task(holder())
        await asyncio.sleep(0)
        waiters = []
        for session in ("full", "", "low"):
            waiters.append(asyncio.create_task(step(session)))
            await asyncio.sleep(0.002)
        release.set()
        await asyncio.gather(first, *waiters)
        return order

    return asyncio.run(run())


def _views() -> dict:  # fresh (a board reader drops stale ones)
    return {
        "low": _view("low", buffered_ms=300),  # U0: about to run dry
        "full": _view("full", buffered_ms=8000),  # U2: well buffered
    }


def test_most_urgent_waiting_step_goes_next():
    assert _order("liveserve", _views()) == ["low", "", "full"]


def test_fcfs_gate_keeps_arrival_order():
    assert _order("fcfs", _views()) == ["full", "", "low"]
