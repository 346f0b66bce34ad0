"""A vocoder replica's batcher (services/stages/urgency_batcher.py): calls that arrive together go in
one forward (up to `max_batch`, aligned by the wait), the most urgent first when more wait than fit,
`slots` forwards at most at once, a cancelled call is not run, a failed forward fails its calls and
not the next ones, and with `max_batch` 1 it is the urgency gate over single calls."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.policies import urgency
from services.stages.urgency_batcher import UrgencyBatcher
from tests.unit.test_urgency_gate import _view


def _batcher(run, max_batch=8, slots=1, wait_s=0.01, views=None, batches=None, alike=lambda item: None):
    return UrgencyBatcher(
        urgency.create("liveserve", {}),
        lambda: views or {},
        run,
        max_batch,
        slots,
        wait_s,
        batches.append if batches is not None else None,
        alike,
    )


def test_calls_that_arrive_together_go_in_one_forward():
    """Items are what a vocoder gets (arrays: calls are never compared by their items)."""

    async def run():
        forwards = []
        b = _batcher(lambda items: (forwards.append([int(i[0]) for i in items]), [i * 10 for i in items])[1])
        got = await asyncio.gather(*(b.run("", np.full(3, i)) for i in range(5)))  # no sessions: chat
        return got, forwards

    got, forwards = asyncio.run(run())
    assert [int(g[0]) for g in got] == [0, 10, 20, 30, 40]
    assert forwards == [[0, 1, 2, 3, 4]]


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 20),
    max_batch=st.integers(1, 6),
    slots=st.integers(1, 3),
    cancel=st.sets(st.integers(0, 19)),
)
def test_batches_are_bounded_and_every_call_not_cancelled_gets_its_result(n, max_batch, slots, cancel):
    async def run():
        running, peak, batches = 0, 0, []

        def forward(items):
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            time.sleep(0.001)
            running -= 1
            return [-i for i in items]

        b = _batcher(forward, max_batch, slots, 0.002, batches=batches)
        tasks = [asyncio.create_task(b.run(f"s{i}", i)) for i in range(n)]
        await asyncio.sleep(0)
        for i in cancel & set(range(n)):
            tasks[i].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return results, peak, batches

    results, peak, batches = asyncio.run(run())
    assert peak <= slots
    assert all(1 <= x.streams <= max_batch for x in batches)
    for i, r in enumerate(results):
        if i not in cancel:
            assert r == -i
    assert sum(x.streams for x in batches) <= n


def test_the_most_urgent_calls_go_first_when_more_wait_than_fit():
    views = {"low": _view("low", 40.0), "full": _view("full", 20_000.0)}

    async def run():
        order = []
        b = _batcher(lambda items: (order.extend(items), items)[1], max_batch=1, wait_s=0.0, views=views)
        first = asyncio.create_task(b.run("first", "first"))
        await asyncio.sleep(0.01)
        rest = [asyncio.create_task(b.run(s, s)) for s in ("full", "", "low")]  # all waiting at once
        await asyncio.gather(first, *rest)
        return order

    order = asyncio.run(run())
    assert order[0] == "first" and order[1] == "low" and order[-1] == "full"


def test_a_failed_forward_fails_its_calls_and_the_next_forward_runs():
    async def run():
        def forward(items):
            if "bad" in items:
                raise RuntimeError("decoder failed")
            return items

        b = _batcher(forward, max_batch=2, wait_s=0.005)
        bad = await asyncio.gather(b.run("a", "bad"), b.run("b", "x"), return_exceptions=True)
        good = await b.run("c", "y")
        return bad, good

    bad, good = asyncio.run(run())
    assert all(isinstance(r, RuntimeError) for r in bad) and good == "y"


def test_a_batch_holds_calls_alike_the_rest_go_in_the_next_one():
    """Chunks of two shapes waiting together: one forward per shape (no padding), the most urgent
    call's shape first, the other on the next slot at once (not after the first forward)."""

    async def run():
        forwards = []

        def forward(items):
            forwards.append(sorted(items))
            time.sleep(0.01)
            return items

        b = _batcher(forward, max_batch=8, slots=2, wait_s=0.005, alike=lambda item: item[0])
        got = await asyncio.gather(*(b.run("", item) for item in ["a1", "b1", "a2", "b2", "a3"]))
        return got, forwards

    got, forwards = asyncio.run(run())
    assert got == ["a1", "b1", "a2", "b2", "a3"]
    assert forwards == [["a1", "a2", "a3"], ["b1", "b2"]]
