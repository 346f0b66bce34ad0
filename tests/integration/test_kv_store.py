"""The store on one node: pages come and go through the eviction policy, L2 overflows to L3 and back,
pins keep pages in place, and Redis always says who provides what."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from kv_store.disk import DiskTier
from kv_store.eviction import PageInfo, create
from kv_store.layout import PageLayout
from kv_store.store import KvStore
from kv_store.transfer import PagePool

LAYOUT = PageLayout(num_layers=1, num_kv_heads=1, head_dim=32, page_tokens=16, dtype="float16")


def _bytes(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 255, LAYOUT.page_bytes, dtype=np.uint8)


async def test_lru_overflow_to_disk_and_back(meta, tmp_path):
    pool = PagePool(f"store-l2-{uuid.uuid4().hex[:6]}", LAYOUT, 3)
    disk = DiskTier(f"store-l3-{uuid.uuid4().hex[:6]}", pool, tmp_path / "l3", 16)
    store = KvStore("node-a", pool, meta, create("lru"), disk)
    try:
        for i in range(5):
            await store.put(f"h{i}", _bytes(i))
        # L2 holds the 3 most recent pages; the 2 oldest went to L3, still provided by this node.
        assert pool.used == 3 and disk.used == 2
        assert (await meta.providers("h0")).holders == {"node-a": "L3"}
        assert (await meta.providers("h4")).tier("node-a") == "L2"
        assert await meta.match([f"h{i}" for i in range(5)]) == 5
        data = await store.get("h0")  # promoted back, evicting the least recently used L2 page
        assert np.array_equal(data, _bytes(0))
        assert (await meta.providers("h0")).tier("node-a") == "L2"
        assert (await meta.providers("h2")).holders == {"node-a": "L3"}
        assert await store.get("missing") is None
    finally:
        disk.close()


async def test_pinned_pages_stay_and_a_full_pool_of_pins_is_an_error(meta):
    pool = PagePool(f"store-pin-{uuid.uuid4().hex[:6]}", LAYOUT, 2)
    store = KvStore("node-b", pool, meta, create("next_use", predict=lambda page: 1.0))
    await store.put("a", _bytes(1), PageInfo(position=0))
    await store.put("b", _bytes(2), PageInfo(position=1))
    assert await store.pin("req", ["a", "b"])
    with pytest.raises(MemoryError):
        await store.put("c", _bytes(3))
    await store.unpin("req", ["b"])
    await store.put("c", _bytes(3))  # b (unpinned) was dropped: no disk tier here
    assert pool.get("b") is None and np.array_equal(pool.get("a"), _bytes(1))
    assert await meta.match(["b"]) == 0


async def test_a_page_pinned_elsewhere_is_not_evicted_here(meta):
    pool = PagePool(f"store-remote-pin-{uuid.uuid4().hex[:6]}", LAYOUT, 2)
    store = KvStore("node-c", pool, meta, create("lru"))
    await store.put("x", _bytes(1))
    await store.put("y", _bytes(2))
    assert await meta.pin("request-on-another-node", ["x"])  # not through this store
    await store.put("z", _bytes(3))  # LRU victim x is in use elsewhere: y goes instead
    assert pool.get("x") is not None and pool.get("y") is None


async def test_prefetch_from_a_peer_hits_skips_and_cancels(meta):
    owner = KvStore(
        "node-owner", PagePool(f"pf-owner-{uuid.uuid4().hex[:6]}", LAYOUT, 8), meta, create("lru")
    )
    reader = KvStore(
        "node-reader", PagePool(f"pf-reader-{uuid.uuid4().hex[:6]}", LAYOUT, 8), meta, create("lru")
    )
    await owner.advertise()
    serving = asyncio.create_task(owner.pool.serve())  # the owner's progress tick for peers' reads
    try:
        for i in range(6):
            await owner.put(f"s{i}", _bytes(10 + i))
        # By session: the session's chain in Redis names its pages.
        await meta.append_chain("tenant/talk", ["s4", "s5"])
        by_session = await (await reader.prefetch("tenant/talk")).wait()
        assert by_session == {"s4": "done", "s5": "done"}
        assert np.array_equal(reader.pool.get("s5"), _bytes(15))
        handle = await reader.prefetch([f"s{i}" for i in range(4)] + ["nobody-has-it"])
        outcomes = await asyncio.wait_for(handle.wait(), 30)
        assert outcomes == {
            "s0": "done",
            "s1": "done",
            "s2": "done",
            "s3": "done",
            "nobody-has-it": "skipped",
        }
        for i in range(4):
            assert np.array_equal(reader.pool.get(f"s{i}"), _bytes(10 + i))
        assert (await meta.providers("s1")).tier("node-reader") == "L2"  # now provided by both
        assert (await (await reader.prefetch(["s0"])).wait()) == {"s0": "hit"}
        cancelled = await reader.prefetch(["s0", "s1"])
        cancelled.cancel()
        assert set((await cancelled.wait()).values()) <= {"cancelled", "hit"}
    finally:
        serving.cancel()


async def test_a_page_being_written_is_not_read_before_it_is_committed(meta):
    """The connector reserves slots, fills them from the engine's blocks on another thread, then
    commits; a concurrent load of the same page waits for the commit instead of reading the slot."""
    store = KvStore("node-w", PagePool(f"w-{uuid.uuid4().hex[:6]}", LAYOUT, 4), meta, create("lru"))
    slots = await store.reserve(["w0", "w0", "w1"])  # listed twice: one slot
    assert set(slots) == {"w0", "w1"}
    reader = asyncio.create_task(store.fetch(["w0"]))
    await asyncio.sleep(0.05)
    assert not reader.done()  # waiting for the writer
    slots["w0"][:] = _bytes(7)
    await store.commit(["w0"])
    got = await asyncio.wait_for(reader, 5)
    assert np.array_equal(got["w0"], _bytes(7))
    store.release(["w0"])
    await store.abandon(["w1"])  # the write failed: the slot goes back, nothing is published
    assert store.pool.slot_of("w1") is None and await meta.match(["w1"]) == 0
