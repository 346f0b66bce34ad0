"""Real NIXL transfers between two processes: page bytes arrive intact, concurrent misses on the
same pages are read once, the synchronous fallback gives the same bytes — all from an owner whose
progress tick is idle until it expects readers (a hand-off) — and an owner that expects none does not
let a reader in."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import redis

from kv_store.layout import PageLayout
from kv_store.transfer import PagePool, PoolAddress, TransferError
from tests.conftest import owner_process

LAYOUT = PageLayout(num_layers=2, num_kv_heads=2, head_dim=64, page_tokens=16, dtype="float16")
N_PAGES = 24


def _page_bytes(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 255, LAYOUT.page_bytes, dtype=np.uint8)


def _owner(redis_url: str, key: str, expect_readers: bool) -> None:
    """Another process: fills a pool, advertises it, serves reads until told to stop. Its idle tick
    (600 s) is too long for any read to finish: `expect_readers` (called after serving started, as
    the KV connector does on a hand-off save) is what lets a reader in."""
    r = redis.Redis.from_url(redis_url)
    pool = PagePool(f"owner-{key}", LAYOUT, N_PAGES)
    slots = {f"page{i}": pool.put(f"page{i}", _page_bytes(i)) for i in range(N_PAGES)}

    async def serve() -> None:
        serving = asyncio.create_task(pool.serve(interval_s=0.001, idle_interval_s=600))
        await asyncio.sleep(0.2)  # idle: waiting out its 600 s tick
        if expect_readers:
            pool.expect_readers(120)
        r.hset(f"{key}:addr", mapping=pool.address().to_redis())
        r.hset(f"{key}:slots", mapping=slots)
        while not r.exists(f"{key}:stop"):
            await asyncio.sleep(0.05)
        serving.cancel()

    asyncio.run(asyncio.wait_for(serve(), 120))


@pytest.fixture
def owner(redis_url, request):
    key = f"kvxfer{time.monotonic_ns()}"
    expect = getattr(request, "param", True)
    proc, r = owner_process(_owner, (redis_url, key, expect), redis_url, f"{key}:slots")
    address = PoolAddress.from_redis(r.hgetall(f"{key}:addr"))
    slots = {k.decode(): int(v) for k, v in r.hgetall(f"{key}:slots").items()}
    yield address, slots
    r.set(f"{key}:stop", 1)
    proc.join(10)


async def test_pull_pages_from_another_process(owner):
    address, slots = owner
    pool = PagePool("reader-async", LAYOUT, N_PAGES)
    wanted = [(f"page{i}", slots[f"page{i}"]) for i in (3, 0, 17, 9)]
    local = await pool.pull(address, wanted)
    for (page, _), slot in zip(wanted, local, strict=True):
        assert np.array_equal(pool.page(slot), _page_bytes(int(page[4:])))
    assert pool.stats["pulled_pages"] == 4


async def test_concurrent_misses_are_read_once(owner):
    address, slots = owner
    pool = PagePool("reader-dedup", LAYOUT, N_PAGES)
    wanted = [(f"page{i}", slots[f"page{i}"]) for i in range(8)]
    results = await asyncio.gather(*(pool.pull(address, wanted) for _ in range(5)))
    assert all(r == results[0] for r in results)
    assert pool.stats["pulled_pages"] == 8  # not 40
    assert pool.stats["dedup_waits"] > 0
    for i in range(8):
        assert np.array_equal(pool.get(f"page{i}"), _page_bytes(i))


def test_synchronous_fallback(owner):
    address, slots = owner
    pool = PagePool("reader-sync", LAYOUT, N_PAGES)
    (slot,) = pool.read_blocking(address, [("page5", slots["page5"])])
    assert np.array_equal(pool.page(slot), _page_bytes(5))


@pytest.mark.parametrize("owner", [False], indirect=True)
async def test_an_idle_owner_does_not_progress_a_read_it_does_not_expect(owner):
    """The control: the same owner without `expect_readers` sets up no connection within a reader's
    timeout, so the tests above pass because of the fast tick, not in spite of the idle one."""
    address, slots = owner
    pool = PagePool("reader-unexpected", LAYOUT, N_PAGES, timeout_s=1.0)
    with pytest.raises(TransferError):
        await pool.pull(address, [("page7", slots["page7"])])
