"""Tenants without Redis: the bounded TTL cache of looked-up keys, and a tenants file that goes bad
on hot reload (the last good one stays, counted, logged without its content)."""

from __future__ import annotations

import logging
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.redis_config import CONNECT_TIMEOUT_S, SOCKET_TIMEOUT_S, async_client, sync_client
from services.quota.tenants import Tenants, TtlCache, key_digest

TTL = 10.0
OPS = st.lists(
    st.tuples(st.sampled_from(["put", "get"]), st.integers(0, 30), st.floats(0, 4)),  # op, key, time step
    max_size=200,
)


@given(st.integers(1, 8), OPS)
def test_ttl_cache_is_bounded_never_stale_and_keeps_what_fits(max_entries, ops):
    cache: TtlCache[int, int] = TtlCache(max_entries, TTL)
    now, version = 0.0, 0
    put_at: dict[int, tuple[float, int]] = {}  # the model: key -> (time, value) of its last put
    for op, key, step in ops:
        now += step
        if op == "put":
            version += 1
            cache.put(key, version, now)
            put_at[key] = (now, version)
        else:
            hit, value = cache.get(key, now)
            fresh = key in put_at and now - put_at[key][0] < TTL
            if hit:  # never a stale or an older value
                assert fresh and value == put_at[key][1]
            elif fresh:  # dropped only for room: more fresh keys than entries since it was put
                since = [k for k, (t, _) in put_at.items() if t >= put_at[key][0]]
                assert len(since) > max_entries
        assert len(cache) <= max_entries


def test_ttl_cache_flood_of_unknown_keys_stays_at_its_bound():
    cache: TtlCache[str, None] = TtlCache(1000, 60.0)
    for i in range(100_000):
        cache.put(key_digest(f"sk-random-{i}"), None, i * 1e-4)
    assert len(cache) == 1000
    assert cache.get(key_digest("sk-random-99999"), 10.0) == (True, None)
    assert cache.get(key_digest("sk-random-0"), 10.0) == (False, None)


class Counted:
    def __init__(self):
        self.failures = 0

    def tenants_reload_failed(self) -> None:
        self.failures += 1


def _write(path, text: str, mtime: int) -> None:
    path.write_text(text)
    os.utime(path, (mtime, mtime))  # a new mtime even within the same second


async def test_malformed_tenants_file_keeps_the_last_good_one_counted_and_logged_without_content(
    tmp_path, caplog
):
    path = tmp_path / "tenants.yaml"
    good = f"tenants:\n- id: alpha\n  api_key_sha256: ['{key_digest('sk-alpha')}']\n"
    _write(path, good, 1)
    metrics = Counted()
    tenants = Tenants(path, reload_s=0.0, metrics=metrics)
    secret = key_digest("sk-new")
    broken = [
        f"tenants:\n- id: beta\n  api_key_sha256: ['{secret}'\n",  # YAML syntax
        f"tenants:\n- id: beta\n  api_key_sha256: ['{secret}']\n  burst_s: 999\n",  # out of range
        f"tenants:\n- id: beta\n  api_key_sha256: ['{secret}']\n  surprise: {secret}\n",  # unknown field
    ]
    caplog.set_level(logging.ERROR, logger="services.quota.tenants")
    for i, text in enumerate(broken):
        _write(path, text, 10 + i)
        assert (await tenants.resolve("sk-alpha")).id == "alpha"
        assert await tenants.resolve("sk-new") is None
        assert await tenants.resolve("sk-alpha") is not None  # the same bad version: counted once
    assert metrics.failures == len(broken)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "YAML syntax error at line 4, column 1" in logged
    assert "tenants.0.burst_s: less_than_equal" in logged and "tenants.0.surprise: extra_forbidden" in logged
    assert secret not in logged and "sk-" not in logged
    path.unlink()  # a file that disappears: the same, reported once
    for _ in range(3):
        assert (await tenants.resolve("sk-alpha")).id == "alpha"
    assert metrics.failures == len(broken) + 1
    _write(path, broken[1].replace("burst_s: 999", "burst_s: 30"), 20)
    assert (await tenants.resolve("sk-new")).id == "beta"
    assert await tenants.resolve("sk-alpha") is None


def test_a_tenants_file_that_is_malformed_at_start_stops_the_start(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants: [{id: 'no spaces allowed'}]\n")
    with pytest.raises(ValueError):
        Tenants(path)


def test_redis_clients_have_bounded_waits_and_the_url_can_change_them():
    for client in (async_client("redis://127.0.0.1:1/0"), sync_client("redis://127.0.0.1:1/0")):
        options = client.connection_pool.connection_kwargs
        assert options["socket_timeout"] == SOCKET_TIMEOUT_S <= 1.0
        assert options["socket_connect_timeout"] == CONNECT_TIMEOUT_S <= 1.0
    options = async_client("redis://h:1/0?socket_timeout=2.5&socket_connect_timeout=3").connection_pool
    assert options.connection_kwargs["socket_timeout"] == 2.5
    assert options.connection_kwargs["socket_connect_timeout"] == 3.0
