"""The quota service against a real Redis: atomic Lua buckets, leases, 429s with headers, the batch
queue, API keys (file, hot reload, Redis), per-tenant realtime session and audio caps."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import OmniError
from services.quota.buckets import Buckets
from services.quota.service import Cost, QuotaService
from services.quota.tenants import Limits, RealtimeLimits, Tenants, TenantSpec, key_digest, put_tenant


@pytest.fixture
async def redis(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _tenant(**kw) -> TenantSpec:
    return TenantSpec(id=kw.pop("id", f"t{uuid.uuid4().hex[:8]}"), **kw)


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 600),
    steps=st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 700)), min_size=1, max_size=25),
)
async def test_bucket_never_negative_never_overspends_refill_monotone(redis_url, capacity, steps):
    client = aioredis.Redis.from_url(redis_url)
    try:
        buckets = Buckets(client, prefix=f"prop{uuid.uuid4().hex}")
        now, spent, prev_level = 0, 0, float(capacity)
        for dt, cost in steps:
            now += dt
            probe = await buckets.admit("t", "r", {"x": (capacity, capacity, 0)}, now_ms=now)
            level = probe.buckets[0].remaining
            # Refill is monotone (no debit in between) and capped at the capacity.
            assert prev_level - 1e-6 <= level <= capacity + 1e-6
            r = await buckets.admit("t", "r", {"x": (capacity, capacity, cost)}, now_ms=now)
            assert r.ok == (cost <= level + 1e-9)
            after = r.buckets[0].remaining
            assert after >= -1e-9
            spent += cost if r.ok else 0
            prev_level = after
            if not r.ok:
                assert r.retry_after_s is None if cost > capacity else r.retry_after_s > 0
        # Never more than the initial budget plus what refilled.
        assert spent <= capacity + capacity * now / 60000 + 1e-6
    finally:
        await client.aclose()


async def test_fifty_concurrent_debits_never_overspend(redis):
    buckets = Buckets(redis, prefix=f"conc{uuid.uuid4().hex}")
    results = await asyncio.gather(
        *(buckets.admit("t", f"r{i}", {"image_tiles": (20, 20, 1)}, now_ms=1000) for i in range(50))
    )
    assert sum(r.ok for r in results) == 20
    assert all(r.retry_after_s and r.retry_after_s > 0 for r in results if not r.ok)


async def test_concurrency_lease_and_release_with_refund(redis):
    buckets = Buckets(redis, prefix=f"lease{uuid.uuid4().hex}")
    costs = {"text_tokens": (100, 100, 40)}
    a = await buckets.admit("t", "a", costs, max_concurrent=2, now_ms=0)
    b = await buckets.admit("t", "b", costs, max_concurrent=2, now_ms=0)
    c = await buckets.admit("t", "c", {"text_tokens": (100, 100, 1)}, max_concurrent=2, now_ms=0)
    assert a.ok and b.ok and not c.ok and c.reason == "concurrency"
    assert b.buckets[0].remaining == pytest.approx(20)
    await buckets.release("t", "a", {"text_tokens": (100, 30)})  # 10 of 40 used
    c = await buckets.admit("t", "c", {"text_tokens": (100, 100, 45)}, max_concurrent=2, now_ms=0)
    assert c.ok and c.buckets[0].remaining == pytest.approx(5)


async def test_interactive_over_budget_gets_429_with_headers(redis):
    tenant = _tenant(per_minute=Limits(image_tiles=10, text_tokens=1000), burst_s=60)
    quota = QuotaService(Tenants(None), Buckets(redis))
    lease = await quota.admit(tenant, "r1", Cost(image_tiles=8, text_tokens=100), "interactive")
    assert lease.headers["x-ratelimit-limit-image-tiles"] == "10"
    assert lease.headers["x-ratelimit-remaining-image-tiles"] == "2"
    with pytest.raises(OmniError) as e:
        await quota.admit(tenant, "r2", Cost(image_tiles=8), "interactive")
    err = e.value
    assert err.status == 429 and err.code == "rate_limit_exceeded" and "image tiles" in err.message
    assert int(err.headers["retry-after"]) >= 1
    assert err.headers["x-ratelimit-remaining-image-tiles"] in ("2", "3")
    assert err.headers["x-ratelimit-reset-image-tiles"].endswith("s")
    # More than a whole minute's budget can never pass: a clear 429 at once, no Retry-After.
    with pytest.raises(OmniError) as e:
        await quota.admit(tenant, "r3", Cost(image_tiles=11), "batch")
    assert e.value.code == "request_exceeds_quota" and "retry-after" not in e.value.headers


async def test_batch_request_queues_then_completes_and_queue_is_bounded(redis):
    # 120 tiles/min = 2 per second.
    tenant = _tenant(per_minute=Limits(image_tiles=120), batch_queue=1, burst_s=60)
    quota = QuotaService(Tenants(None), Buckets(redis))
    await quota.admit(tenant, "fill", Cost(image_tiles=119), "interactive")
    waiting = asyncio.create_task(quota.admit(tenant, "batch", Cost(image_tiles=3), "batch"))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    with pytest.raises(OmniError) as e:  # the queue (1) is taken
        await quota.admit(tenant, "batch2", Cost(image_tiles=3), "batch")
    assert e.value.status == 429 and "queue is full" in e.value.message
    lease = await asyncio.wait_for(waiting, 5)
    assert 0.5 < lease.queued_s < 3


async def test_api_keys_from_file_hot_reload_and_redis(redis, tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text(f"tenants:\n- id: alpha\n  api_key_sha256: ['{key_digest('sk-alpha')}']\n")
    tenants = Tenants(path, redis, reload_s=0.0)
    quota = QuotaService(tenants, Buckets(redis))
    assert (await quota.authenticate("sk-alpha")).id == "alpha"
    for key in (None, "", "sk-nope"):
        with pytest.raises(OmniError) as e:
            await quota.authenticate(key)
        assert e.value.status == 401 and e.value.code == "invalid_api_key"
    # Hot reload: a new key in the file works without a restart.
    path.write_text(
        f"tenants:\n- id: beta\n  api_key_sha256: ['{key_digest('sk-beta')}']\n  max_class: realtime\n"
    )
    import os

    os.utime(path, (1, 1))  # a different mtime even within the same second
    assert (await quota.authenticate("sk-beta")).id == "beta"
    with pytest.raises(OmniError):
        await quota.authenticate("sk-alpha")
    # Registered in Redis at run time.
    await put_tenant(redis, TenantSpec(id="gamma"), ["sk-gamma"])
    assert (await quota.authenticate("sk-gamma")).id == "gamma"


async def test_burst_is_bounded_by_burst_seconds(redis):
    # 600 tiles/min with a 5 s burst: at most 50 at once, then 10 per second.
    tenant = _tenant(per_minute=Limits(image_tiles=600), burst_s=5)
    quota = QuotaService(Tenants(None), Buckets(redis))
    lease = await quota.admit(tenant, "a", Cost(image_tiles=50), "interactive")
    assert lease.headers["x-ratelimit-limit-image-tiles"] == "600"
    with pytest.raises(OmniError) as e:
        await quota.admit(tenant, "b", Cost(image_tiles=5), "interactive")
    assert e.value.code == "rate_limit_exceeded"
    with pytest.raises(OmniError) as e:
        await quota.admit(tenant, "c", Cost(image_tiles=51), "batch")
    assert e.value.code == "request_exceeds_quota" and "5s" in e.value.message


def _service(redis) -> QuotaService:
    """One gateway replica's quota service (keys under a prefix of this test's own)."""
    return QuotaService(Tenants(None), Buckets(redis, prefix=f"rt{uuid.uuid4().hex}"))


async def test_realtime_session_cap_is_shared_by_gateways_and_freed_on_close(redis):
    tenant = _tenant(realtime=RealtimeLimits(max_sessions=2))
    a = _service(redis)
    b = QuotaService(Tenants(None), Buckets(redis, prefix=a.buckets.prefix))  # another gateway
    await a.open_session(tenant, "s1")
    await b.open_session(tenant, "s2")
    with pytest.raises(OmniError) as e:
        await a.open_session(tenant, "s3")
    assert e.value.status == 429 and e.value.code == "session_limit_reached"
    assert e.value.headers["retry-after"] == "1"
    await b.close_session(tenant, "s2")
    await a.open_session(tenant, "s3")
    # Another tenant's sessions are not counted against this one.
    await a.open_session(_tenant(realtime=RealtimeLimits(max_sessions=1)), "s1")


async def test_tenant_without_realtime_caps_never_touches_redis_for_sessions(redis):
    service = _service(redis)
    tenant = _tenant()
    await service.open_session(tenant, "s1")
    await service.spend_session_audio(tenant, "s1", 30.0)
    await service.close_session(tenant, "s1")
    assert await redis.keys(f"{service.realtime.prefix}:*") == []


async def test_realtime_audio_budget_per_minute(redis):
    tenant = _tenant(
        per_minute=Limits(audio_seconds=600), realtime=RealtimeLimits(audio_seconds_per_minute=60)
    )
    service = _service(redis)
    await service.spend_session_audio(tenant, "s1", 50.0)
    await service.spend_session_audio(tenant, "s2", 8.0)  # all sessions of the tenant share it
    with pytest.raises(OmniError) as e:
        await service.spend_session_audio(tenant, "s1", 5.0)
    err = e.value
    assert err.status == 429 and err.code == "rate_limit_exceeded" and "realtime audio seconds" in err.message
    assert err.headers["x-ratelimit-limit-realtime-audio-seconds"] == "60"
    assert 1 <= int(err.headers["retry-after"]) <= 4
    with pytest.raises(OmniError) as e:  # more than a minute of it: waiting would not help
        await service.spend_session_audio(tenant, "s1", 61.0)
    assert e.value.code == "request_exceeds_quota" and "retry-after" not in e.value.headers
    # The realtime budget is its own: a request's audio_seconds bucket is untouched by it.
    lease = await service.admit(tenant, "r1", Cost(audio_seconds=10), "interactive")
    assert lease.headers["x-ratelimit-remaining-audio-seconds"] == "90"  # 600/min, 10 s burst: 100
