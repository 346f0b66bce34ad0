"""`within`: an await bounded by its own deadline tells its expiry (Overdue, the awaited call
cancelled) from the call's own TimeoutError, and lets a caller's cancellation through."""

from __future__ import annotations

import asyncio

import pytest

from services.common.deadline import Overdue, within


async def test_a_result_in_time_is_returned():
    assert await within(1.0, asyncio.sleep(0.01, result="ok")) == "ok"


async def test_past_its_deadline_the_call_is_cancelled_and_overdue_raised():
    cancelled = asyncio.Event()

    async def never():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(Overdue) as raised:
        await within(0.05, never())
    assert cancelled.is_set() and raised.value.after_s == 0.05


async def test_the_calls_own_timeout_passes_through():
    async def times_out():
        raise TimeoutError("the call's socket")

    with pytest.raises(TimeoutError, match="socket"):
        await within(1.0, times_out())


async def test_a_callers_cancel_is_not_taken_for_the_deadline():
    task = asyncio.create_task(within(10.0, asyncio.sleep(60)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
