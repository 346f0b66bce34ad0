"""KV page metadata on a real Redis: publish/match/pin/evict are atomic, eviction races never
lose a page that is in use or the last copy of a page, and session chains expire unless used."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_store.metadata import KvMetadata


async def test_prefix_match_and_session_chain(meta):
    await meta.publish("proc-a", "L2", 4096, ["h0", "h1", "h2"])
    assert await meta.match(["h0", "h1", "h2", "h3"]) == 3
    assert await meta.match(["h0", "hX", "h2"]) == 1
    await meta.append_chain("tenant/s1", ["h0", "h1"])
    await meta.append_chain("tenant/s1", ["h2"])
    assert await meta.chain("tenant/s1") == ["h0", "h1", "h2"]
    assert (await meta.providers("h1")).holders == {"proc-a": "L2"}


async def test_session_chain_expires_after_its_last_save_or_read(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    meta = KvMetadata(client, prefix=f"t{uuid.uuid4().hex}", chain_ttl_s=1.0)
    key = f"{meta.prefix}:chain:tenant/s1"
    await meta.append_chain("tenant/s1", ["h0"])
    assert 0 < await client.pttl(key) <= 1000
    await asyncio.sleep(0.6)
    assert await meta.chain("tenant/s1") == ["h0"]  # a read is a use: the TTL starts again
    assert await client.pttl(key) > 700
    await asyncio.sleep(0.6)
    await meta.append_chain("tenant/s1", ["h1"])
    assert await client.pttl(key) > 700
    await asyncio.sleep(1.1)
    assert await meta.chain("tenant/s1") == [] and not await client.exists(key)
    await client.aclose()


async def test_live_matching_counts_only_providers_with_a_heartbeat(meta):
    await meta.publish("alive", "L2", 4096, ["a0", "a1"])
    await meta.publish("silent", "L2", 4096, ["a1", "a2"])
    await meta.heartbeat("alive", 5_000)
    assert await meta.match(["a0", "a1", "a2"]) == 3
    assert await meta.match(["a0", "a1", "a2"], live_only=True) == 2  # a2 only on a silent provider
    await meta.heartbeat("silent", 5_000)
    assert await meta.match(["a0", "a1", "a2"], live_only=True) == 3
    await meta.declare_dead("silent")  # a peer that could not be reached
    assert await meta.match(["a0", "a1", "a2"], live_only=True) == 2
    assert await meta.match(["a2"]) == 0  # and its copies are forgotten
    assert not await meta.alive("silent")


async def test_eviction_checks_pins_locks_and_last_copy(meta):
    await meta.publish("a", "L1", 1, ["p"])
    await meta.publish("b", "L2", 1, ["p"])
    assert await meta.pin("req", ["p"], now_ms=0)
    assert await meta.evict("p", "a", now_ms=1) == "in_use"
    await meta.unpin("req", ["p"])
    assert await meta.lock("p", "b")
    assert await meta.evict("p", "a", now_ms=2) == "locked"
    await meta.unlock("p", "b")
    assert await meta.evict("p", "a", now_ms=3) == "ok"
    assert await meta.evict("p", "b", now_ms=4) == "last_copy"
    assert await meta.evict("p", "b", now_ms=5, allow_last=True) == "ok"
    assert await meta.match(["p"]) == 0
    assert not await meta.pin("req2", ["p"], now_ms=6)  # gone: nothing to pin


async def test_expired_pin_does_not_block_eviction(meta):
    await meta.publish("a", "L2", 1, ["p"])
    await meta.publish("b", "L2", 1, ["p"])
    assert await meta.pin("crashed", ["p"], now_ms=0, ttl_ms=100)
    assert await meta.evict("p", "a", now_ms=50) == "in_use"
    assert await meta.evict("p", "a", now_ms=200) == "ok"


async def test_two_evictors_one_page_never_lose_the_last_copy(meta):
    for i in range(50):
        page = f"race{i}"
        await meta.publish("a", "L2", 1, [page])
        await meta.publish("b", "L2", 1, [page])
        results = await asyncio.gather(meta.evict(page, "a", now_ms=0), meta.evict(page, "b", now_ms=0))
        assert sorted(results) == ["last_copy", "ok"]
        assert await meta.match([page]) == 1


async def test_dead_provider_is_dropped(meta):
    await meta.publish("dead", "L1", 1, ["x", "y"])
    await meta.publish("alive", "L2", 1, ["y"])
    assert await meta.drop_provider("dead") == 2
    assert await meta.match(["x"]) == 0 and await meta.match(["y"]) == 1


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["pin", "unpin", "evict_a", "evict_b"]), st.integers(0, 2)), max_size=40
    )
)
async def test_pinned_pages_always_have_a_copy(redis_url, ops):
    """Any concurrent mix of pins and evictions: while a request holds a pin, the page has a provider."""
    client = aioredis.Redis.from_url(redis_url)
    meta = KvMetadata(client, prefix=f"prop{uuid.uuid4().hex}")
    try:
        pages = [f"p{i}" for i in range(3)]
        for provider in ("a", "b"):
            await meta.publish(provider, "L2", 1, pages)
        pinned: set[str] = set()

        async def step(op, i):
            page = pages[i]
            if op == "pin" and await meta.pin(f"r{i}", [page], now_ms=0):
                pinned.add(page)
            elif op == "unpin" and page in pinned:
                pinned.discard(page)
                await meta.unpin(f"r{i}", [page])
            elif op.startswith("evict"):
                await meta.evict(page, op[-1], now_ms=0, allow_last=True)

        await asyncio.gather(*(step(op, i) for op, i in ops))
        for page in pinned:
            assert await meta.match([page]) == 1
    finally:
        await client.aclose()


async def test_a_long_prompts_providers_are_one_round_trip(meta):
    """A 4K-token prompt's ~130 pages looked up at once: more than the client's pool of 100
    connections (redis-py's default) once cost a MaxConnectionsError — the breaker opened and the
    decode engine recomputed the prompt the prefill had just handed it."""
    pages = [f"long{i}" for i in range(300)]
    await meta.publish("prefill", "L2", 4096, pages)
    listed = await meta.providers_of(pages)
    assert [p.page for p in listed] == pages and all(p.holders == {"prefill": "L2"} for p in listed)
