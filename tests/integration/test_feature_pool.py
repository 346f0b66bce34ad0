"""Encoder features over real NIXL between two processes (kv_store/features.py): an item written by
an encoder-side pool is read intact by a thinker-side reader, item by item as they are written; an
item evicted while it is read is refused, never handed on; a pool never evicts within its hold."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import redis

from kv_store.features import PAGE_BYTES, FeaturePool, FeatureReader, FeatureUnavailable
from tests.conftest import owner_process


def _features(i: int, rows: int = 300) -> np.ndarray:
    return np.random.default_rng(i).standard_normal((rows, 96)).astype(np.float32)


def _owner(redis_url: str, key: str) -> None:
    """Another process (an encoder replica): writes item n when told `key:write` = n."""
    r = redis.Redis.from_url(redis_url)
    pool = FeaturePool(f"enc-{key}", 8 << 20, r, hold_s=60, ttl_s=120)

    async def serve() -> None:
        serving = asyncio.create_task(pool.serve())
        pool.advertise(every_s=0)
        r.set(f"{key}:up", 1)
        written = 0
        while not r.exists(f"{key}:stop"):
            wanted = int(r.get(f"{key}:write") or 0)
            while written < wanted:
                pool.put(f"{key}/item{written}", _features(written))
                pool.expect_readers()
                written += 1
            await asyncio.sleep(0.01)
        serving.cancel()

    asyncio.run(asyncio.wait_for(serve(), 120))


@pytest.fixture
def owner(redis_url):
    key = f"ecpool{time.monotonic_ns()}"
    proc, r = owner_process(_owner, (redis_url, key), redis_url, f"{key}:up")
    yield key, r
    r.set(f"{key}:stop", 1)
    proc.join(10)


def _wait_indexed(reader: FeatureReader, key: str) -> None:
    deadline = time.monotonic() + 10
    while reader.entry(key) is None:
        assert time.monotonic() < deadline, f"{key} was never indexed"
        time.sleep(0.01)


def test_items_are_read_as_they_are_written(owner, redis_url):
    key, r = owner
    reader = FeatureReader("thinker-reader", redis.Redis.from_url(redis_url), landing_bytes=4 * PAGE_BYTES)
    with pytest.raises(FeatureUnavailable):
        reader.read(f"{key}/item0")  # not written yet
    for n in range(3):
        r.set(f"{key}:write", n + 1)
        _wait_indexed(reader, f"{key}/item{n}")
        got = reader.read(f"{key}/item{n}")  # 115 KB: read through a 4-page landing pool in parts
        assert got.dtype == np.float32 and np.array_equal(got, _features(n))
    assert reader.stats["read_items"] == 3


def test_an_item_evicted_while_read_is_refused(redis_url):
    r = redis.Redis.from_url(redis_url)
    pool = FeaturePool(f"enc-evict{time.monotonic_ns()}", 4 * PAGE_BYTES, r, hold_s=0.0, ttl_s=60)
    reader = FeatureReader("thinker-evict", redis.Redis.from_url(redis_url))
    pool.put("a", _features(1, rows=100))  # 38 KB: one page
    entry = reader.entry("a")
    # Evicted and its slot reused between the reader's lookup and its check.
    pool.put("b", np.zeros((4 * PAGE_BYTES // 4 - 10,), np.float32))
    assert reader.entry("a") is None and not pool.has("a") and pool.stats["evicted_items"] == 1
    r.set("omniray:ec:item:a", entry.dumps())  # the lookup the reader made before the eviction
    calls = iter([entry, None])
    reader.entry = lambda key: next(calls)
    stop = threading.Event()
    progress = threading.Thread(
        target=lambda: [pool.pool.progress() for _ in iter(lambda: stop.wait(0.001), True)]
    )
    progress.start()  # the owner's progress (an encoder replica's serve loop)
    try:
        with pytest.raises(FeatureUnavailable, match="evicted while being read"):
            reader.read("a")
    finally:
        stop.set()
        progress.join()


def test_no_eviction_within_the_hold(redis_url):
    r = redis.Redis.from_url(redis_url)
    pool = FeaturePool(f"enc-hold{time.monotonic_ns()}", 2 * PAGE_BYTES, r, hold_s=60, ttl_s=60)
    assert pool.put("x", _features(2, rows=100))
    assert pool.put("y", _features(3, rows=100))
    assert not pool.fits(PAGE_BYTES) and not pool.put("z", _features(4, rows=100))
    assert pool.has("x") and pool.has("y") and pool.stats["refused_items"] == 1
