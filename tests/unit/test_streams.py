import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.streams import coalesce


async def _source(items, delays):
    for item, delay in zip(items, delays, strict=True):
        if delay:
            await asyncio.sleep(delay)
        yield item


@settings(deadline=None, max_examples=30)
@given(st.lists(st.integers(), max_size=30), st.data())
def test_coalesce_keeps_order_and_content(items, data):
    delays = data.draw(st.lists(st.sampled_from([0, 0, 0.001]), min_size=len(items), max_size=len(items)))

    async def run():
        return [batch async for batch in coalesce(_source(items, delays), list)]

    batches = asyncio.run(run())
    assert [x for b in batches for x in b] == items
    assert all(batches)


def test_coalesce_merges_what_piles_up():
    async def run():
        out = []
        async for batch in coalesce(_source(range(10), [0] * 10), list):
            out.append(batch)
            await asyncio.sleep(0.01)  # a slow consumer
        return out

    batches = asyncio.run(run())
    assert len(batches) < 10 and [x for b in batches for x in b] == list(range(10))


def test_coalesce_reraises_producer_errors():
    async def bad():
        yield 1
        raise RuntimeError("boom")

    async def run():
        return [b async for b in coalesce(bad(), list)]

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(run())
