"""The realtime hub with the quota service on a real Redis: a tenant over its session cap is refused
(`limit`) across gateway replicas and gets its slot back when a session closes; with Redis stalled
a capped tenant is refused within 2 s and an uncapped one still opens sessions."""

from __future__ import annotations

import time
import uuid

import pytest

from services.common.redis_config import async_client
from services.models.profile import load_profile
from services.quota.buckets import Buckets
from services.quota.service import QuotaService
from services.quota.tenants import Tenants, key_digest
from services.realtime.hub import RealtimeHub, Refused

TENANTS = f"""tenants:
- id: capped
  api_key_sha256: ['{key_digest("sk-capped")}']
  realtime: {{max_sessions: 1}}
- id: open
  api_key_sha256: ['{key_digest("sk-open")}']
"""


@pytest.fixture
def hubs(tmp_path, monkeypatch):
    """Two gateway replicas' hubs on one Redis (the URL is set per test)."""
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    prefix = f"q{uuid.uuid4().hex}"
    made: list[RealtimeHub] = []

    def make(url: str) -> RealtimeHub:
        monkeypatch.setenv("OMNIRAY_REDIS_URL", url)  # the hub's session board
        client = async_client(url)
        quota = QuotaService(Tenants(path, client), Buckets(client, prefix=prefix))
        made.append(RealtimeHub(None, load_profile("tiny"), quota))
        return made[-1]

    yield make
    for hub in made:
        if hub._board is not None:
            hub._board.cancel()


async def _send(event) -> None:
    pass


async def test_a_tenant_over_its_session_cap_is_refused_across_gateways(redis_url, hubs):
    a, b = hubs(redis_url), hubs(redis_url)
    first = await a.open("sk-capped", None, _send)
    with pytest.raises(Refused) as e:
        await b.open("sk-capped", None, _send)
    assert e.value.reason == "limit" and e.value.event.error.code == "session_limit_reached"
    assert b.admission.active == 0  # refused before this replica's admission was taken
    others = [await b.open("sk-open", None, _send) for _ in range(3)]  # another tenant is not capped
    await a.close(first)
    second = await b.open("sk-capped", None, _send)
    for hub, session in [(b, second)] + [(b, s) for s in others]:
        await hub.close(session)


async def test_stalled_redis_refuses_a_capped_tenant_quickly_and_an_uncapped_one_opens(redis_server, hubs):
    hub = hubs(redis_server.url)
    with redis_server.paused():
        start = time.monotonic()
        with pytest.raises(Refused) as e:
            await hub.open("sk-capped", None, _send)
        elapsed = time.monotonic() - start
        assert e.value.reason == "unavailable" and e.value.event.error.code == "quota_unavailable"
        assert elapsed < 2.0
        session = await hub.open("sk-open", None, _send)  # no cap: no Redis call on the way in
        await hub.close(session)
    print(f"realtime open, Redis stalled: refused after {elapsed * 1000:.0f} ms")
