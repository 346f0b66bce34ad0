"""Redis faults, with a real server of each test's own: stalled (SIGSTOP), killed, restarted
empty on its port, and refusing writes (full: OOM; a replica after a failover: READONLY). Quota admission answers 503 + Retry-After within 2 s (fail_open tenants are
admitted unmetered); keys from the tenants file authenticate without Redis; the KV metadata skips
lookups and saves and counts them; the session board keeps its last views. When Redis is back,
everything works again with the same objects — nothing is rebuilt."""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np
import pytest

from kv_store.agent import AgentConfig, StoreAgent
from kv_store.eviction import create
from kv_store.layout import PageLayout
from kv_store.metadata import COOLDOWN_S, KvMetadata, MetadataUnavailable, connect
from kv_store.metrics import Totals, replay
from kv_store.store import KvStore
from kv_store.transfer import PagePool
from services.common.errors import OmniError
from services.common.redis_config import async_client
from services.playback.board import BoardReader, BoardWriter
from services.playback.monitor import PlaybackMonitor
from services.quota.buckets import Buckets
from services.quota.service import Cost, QuotaService
from services.quota.tenants import Limits, RealtimeLimits, Tenants, TenantSpec, key_digest, put_tenant

BOUND_S = 2.0  # the bound for an answer while Redis is away
LAYOUT = PageLayout(num_layers=1, num_kv_heads=1, head_dim=32, page_tokens=16, dtype="float16")


class Calls:
    """A metrics sink that remembers the calls made to it (QuotaMetrics' methods)."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append((name, *args))

    def count(self, name: str, *args) -> int:
        return sum(1 for c in self.calls if c[0] == name and c[1 : 1 + len(args)] == args)


async def timed(coro) -> tuple[float, object]:
    """(seconds, result or the exception raised)."""
    start = time.monotonic()
    try:
        result = await coro
    except Exception as e:  # the caller asserts what it expected
        result = e
    return time.monotonic() - start, result


def assert_unavailable(result, elapsed: float) -> None:
    assert isinstance(result, OmniError), result
    assert result.status == 503 and result.code == "quota_unavailable"
    assert result.headers == {"retry-after": "1"}
    assert elapsed < BOUND_S


@pytest.fixture
async def quota(redis_server, tmp_path):
    """A quota service as a gateway builds it: one key in the tenants file, one registered in Redis."""
    client = async_client(redis_server.url)
    path = tmp_path / "tenants.yaml"
    path.write_text(f"tenants:\n- id: filed\n  api_key_sha256: ['{key_digest('sk-file')}']\n")
    await put_tenant(client, TenantSpec(id="registered"), ["sk-registered"])
    metrics = Calls()
    service = QuotaService(Tenants(path, client, reload_s=0.0), Buckets(client), metrics)
    yield service, metrics
    await client.aclose()


def _tenant(**kw) -> TenantSpec:
    return TenantSpec(id=f"t{uuid.uuid4().hex[:8]}", per_minute=Limits(text_tokens=10_000), **kw)


async def test_stalled_redis_is_a_503_within_2s_and_admission_resumes(redis_server, quota):
    service, metrics = quota
    tenant = _tenant()
    await service.admit(tenant, "warm", Cost(text_tokens=10), "interactive")
    with redis_server.paused():
        elapsed, result = await timed(service.admit(tenant, "r1", Cost(text_tokens=10), "interactive"))
        assert_unavailable(result, elapsed)
        print(f"admit, Redis stalled: 503 after {elapsed * 1000:.0f} ms")
        # Under traffic: 50 requests at once, every one answered within the bound.
        answers = await asyncio.gather(
            *(timed(service.admit(tenant, f"c{i}", Cost(text_tokens=1), "interactive")) for i in range(50))
        )
        for elapsed, result in answers:
            assert_unavailable(result, elapsed)
        print(f"50 concurrent admits, Redis stalled: slowest 503 after {max(answers)[0] * 1000:.0f} ms")
        # A key from the tenants file needs no Redis; one registered in Redis cannot be checked.
        elapsed, result = await timed(service.authenticate("sk-file"))
        assert result.id == "filed" and elapsed < 0.05
        elapsed, result = await timed(service.authenticate("sk-registered"))
        assert_unavailable(result, elapsed)
        print(f"authenticate (Redis-registered key), Redis stalled: 503 after {elapsed * 1000:.0f} ms")
    elapsed, lease = await timed(service.admit(tenant, "r2", Cost(text_tokens=10), "interactive"))
    assert lease.metered and elapsed < 1.0
    print(f"admit after SIGCONT: admitted in {elapsed * 1000:.0f} ms")
    assert (await service.authenticate("sk-registered")).id == "registered"
    assert metrics.count("redis_error", "admit") == 51 and metrics.count("redis_error", "authenticate") == 1
    assert metrics.count("rejected", tenant.id, "none", "quota_unavailable") == 51


async def test_killed_redis_is_a_503_and_a_restarted_one_admits_without_a_rebuild(redis_server, quota):
    service, metrics = quota
    tenant = _tenant(max_concurrent=4)
    lease = await service.admit(tenant, "before", Cost(text_tokens=10), "interactive")
    redis_server.kill()
    elapsed, result = await timed(service.admit(tenant, "r1", Cost(text_tokens=10), "interactive"))
    assert_unavailable(result, elapsed)
    print(f"admit, Redis killed: 503 after {elapsed * 1000:.0f} ms")
    elapsed, result = await timed(service.release(lease))  # a stream that ends now still ends cleanly
    assert result is None and elapsed < BOUND_S
    redis_server.restart()
    elapsed, lease = await timed(service.admit(tenant, "r2", Cost(text_tokens=10), "interactive"))
    assert lease.metered and elapsed < 1.0
    print(f"admit, Redis restarted on its port: admitted in {elapsed * 1000:.0f} ms")
    await service.release(lease)
    assert metrics.count("redis_error", "release") == 1


@pytest.mark.parametrize(
    "refusing",
    [("CONFIG", "SET", "maxmemory", "1"), ("REPLICAOF", "127.0.0.1", "1")],
    ids=["full (OOM)", "read-only replica"],
)
async def test_redis_refusing_writes_is_a_503_not_a_500(redis_server, quota, refusing):
    service, _ = quota
    tenant = _tenant()
    client = async_client(redis_server.url)
    await client.execute_command(*refusing)
    try:
        elapsed, result = await timed(service.admit(tenant, "r1", Cost(text_tokens=10), "interactive"))
        assert_unavailable(result, elapsed)
    finally:
        await client.execute_command("CONFIG", "SET", "maxmemory", "0")
        await client.execute_command("REPLICAOF", "NO", "ONE")
        await client.aclose()
    elapsed, lease = await timed(service.admit(tenant, "r2", Cost(text_tokens=10), "interactive"))
    assert lease.metered


async def test_fail_open_tenant_is_admitted_unmetered_and_counted(redis_server, quota):
    service, metrics = quota
    tenant = _tenant(fail_open=True, realtime=RealtimeLimits(max_sessions=1, audio_seconds_per_minute=60))
    with redis_server.paused():
        elapsed, lease = await timed(service.admit(tenant, "r1", Cost(text_tokens=10), "realtime"))
        assert not lease.metered and elapsed < BOUND_S
        elapsed, result = await timed(service.release(lease))
        assert result is None and elapsed < 0.05  # nothing to give back: no Redis call
        await service.open_session(tenant, "s1")  # no raise: admitted
        await service.spend_session_audio(tenant, "s1", 5.0)
    assert metrics.count("unmetered", tenant.id, "realtime") == 3
    assert (await service.admit(tenant, "r2", Cost(text_tokens=10), "realtime")).metered


async def test_realtime_session_calls_fail_closed_within_2s(redis_server, quota):
    service, metrics = quota
    tenant = _tenant(realtime=RealtimeLimits(max_sessions=2, audio_seconds_per_minute=60))
    await service.open_session(tenant, "s1")
    with redis_server.paused():
        elapsed, result = await timed(service.open_session(tenant, "s2"))
        assert_unavailable(result, elapsed)
        elapsed, result = await timed(service.spend_session_audio(tenant, "s1", 3.0))
        assert_unavailable(result, elapsed)
        elapsed, result = await timed(service.close_session(tenant, "s1"))
        assert result is None and elapsed < BOUND_S
    await service.open_session(tenant, "s2")
    assert metrics.count("redis_error", "session_close") == 1


# ---- KV metadata --------------------------------------------------------------------------------


def _totals(agent: StoreAgent) -> dict[str, float]:
    totals = Totals()
    replay(agent.recorder.drain(), totals)
    return totals.values


def _eventually(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "did not recover in time"
        time.sleep(0.05)


def test_kv_lookup_with_redis_away_is_a_counted_miss_then_hits_again(redis_server):
    agent = StoreAgent(AgentConfig(redis_url=redis_server.url, llm_version="v1"))
    provider, chain = f"p-{uuid.uuid4().hex[:6]}", ["a", "b", "c"]

    def provide() -> None:
        agent.run(agent.meta.publish(provider, "L2@0", LAYOUT.page_bytes, ["a", "b"]))
        agent.run(agent.meta.heartbeat(provider, 60_000))

    provide()
    assert agent.lookup(chain) == 2
    with redis_server.paused():
        start = time.monotonic()
        assert agent.lookup(chain) == 0
        stalled = time.monotonic() - start
        start = time.monotonic()
        assert agent.lookup(chain) == 0  # within the cool-down: refused without waiting on Redis
        refused = time.monotonic() - start
    assert stalled < BOUND_S and refused < 0.05
    print(f"KV lookup, Redis stalled: miss after {stalled * 1000:.0f} ms, then {refused * 1000:.1f} ms")
    values = _totals(agent)
    assert values["omniray_kv_errors_total{lookup}"] == 2
    assert values["omniray_kv_redis_errors_total{match}"] == 2
    _eventually(lambda: agent.lookup(chain) == 2)
    redis_server.kill()
    start = time.monotonic()
    assert agent.lookup(chain) == 0
    assert time.monotonic() - start < BOUND_S
    redis_server.restart()  # empty: the same agent and client publish again on a new connection
    _eventually(lambda: _succeeds(provide))
    assert agent.lookup(chain) == 2


def _succeeds(action) -> bool:
    try:
        action()
    except MetadataUnavailable:  # still cooling down
        return False
    return True


async def test_kv_save_with_redis_stalled_is_skipped_counted_and_holds_nothing(redis_server):
    totals = Totals()
    client = connect(redis_server.url)
    meta = KvMetadata(client, prefix=f"t{uuid.uuid4().hex}", metrics=totals)
    pool = PagePool(f"faults-{uuid.uuid4().hex[:6]}", LAYOUT, 3)
    store = KvStore("node", pool, meta, create("lru"))
    page = np.zeros(LAYOUT.page_bytes, np.uint8)
    await store.put("a", page)
    await store.put("b", page)
    with redis_server.paused():
        # A save that needs room: "c" gets the free slot, "d" needs an eviction Redis cannot agree to.
        start = time.monotonic()
        with pytest.raises(MetadataUnavailable):
            await store.reserve(["c", "d"])
        elapsed = time.monotonic() - start
        assert pool.used == 2 and not store.here("c")  # "c"'s reserved slot went back
        # A load of that page waits for no write: it fails at once (the connector recomputes).
        with pytest.raises(MetadataUnavailable):
            await asyncio.wait_for(store.fetch(["c"]), 0.1)
        # A save with room: its pages stay local and unpublished, the chain is not extended.
        with pytest.raises(MetadataUnavailable):
            await meta.append_chain("s", ["a", "b"])
    assert elapsed < BOUND_S
    print(f"KV save, Redis stalled: skipped after {elapsed * 1000:.0f} ms")
    assert totals.values["omniray_kv_redis_errors_total{evict}"] == 1
    assert totals.values["omniray_kv_redis_errors_total{append_chain}"] == 1
    await asyncio.sleep(COOLDOWN_S)
    await store.put("c", page)  # Redis is back: saves work again on the same client
    assert await meta.match(["a", "b", "c"]) == 3 and await meta.chain("s") == []
    await client.aclose()


async def test_session_board_keeps_its_last_views_while_redis_is_stalled(redis_server):
    monitor = PlaybackMonitor()
    client = async_client(redis_server.url)
    writer = BoardWriter(monitor, client, interval_s=0.02)
    reader = BoardReader(redis_server.url, interval_s=0.02)
    monitor.open("t/a")
    task = asyncio.create_task(writer.run())
    try:
        await asyncio.to_thread(_eventually, lambda: "t/a" in reader.views())
        with redis_server.paused():
            elapsed, result = await timed(writer.publish())
            assert result is not None and elapsed < BOUND_S  # the error the loop logs and skips
            monitor.open("t/b")
            await asyncio.sleep(0.5)
            assert "t/a" in reader.views() and not task.done()
        await asyncio.to_thread(_eventually, lambda: {"t/a", "t/b"} <= reader.views().keys())
    finally:
        task.cancel()
        await client.aclose()


async def test_client_secrets_fail_closed_within_2s(redis_server, quota):
    """Minting or redeeming a client secret with Redis stalled is a 503 in bounded time (never a
    secret that was not stored, nor a session opened on one that cannot be checked)."""
    service, metrics = quota
    tenant = await service.authenticate("sk-file")
    value, _ = await service.mint_secret(tenant, {}, 60)
    with redis_server.paused():
        for call in (service.mint_secret(tenant, {}, 60), service.redeem_secret(value)):
            elapsed, result = await timed(call)
            assert_unavailable(result, elapsed)
    assert metrics.count("redis_error", "client_secret") == 2
    assert (await service.redeem_secret(value))[0].id == "filed"  # not used up by the failed try
