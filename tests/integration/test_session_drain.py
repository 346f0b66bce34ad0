"""A gateway replica that drains moves its realtime sessions (services/realtime/hub.py `drain`):
each is saved as it is, its client gets `omniray.session.migrate` and the connection ends; the
client reconnecting with the session id on another replica gets the conversation back, in the
tenant's one session slot (kept for that reconnect). Two gateway replicas' hubs on one real Redis;
the Serve drain signal itself is tests/contracts/test_ray_internals.py, the whole path with a
model behind it tests/e2e/faults/test_realtime_resume.py."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from services.common.redis_config import async_client
from services.models.profile import load_profile
from services.quota.buckets import Buckets
from services.quota.service import QuotaService
from services.quota.tenants import Tenants, key_digest
from services.realtime import server_events as se
from services.realtime.hub import RealtimeHub, Refused

TENANTS = f"""tenants:
- id: capped
  api_key_sha256: ['{key_digest("sk-capped")}']
  realtime: {{max_sessions: 1}}
"""


@pytest.fixture
def gateways(tmp_path, monkeypatch, redis_url):
    """Two gateway replicas' hubs on one Redis, sessions resumable (realtime.continuity on)."""
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    monkeypatch.setenv("OMNIRAY_REDIS_URL", redis_url)  # the session store and board
    prefix = f"q{uuid.uuid4().hex}"
    profile = load_profile("tiny")
    assert profile.realtime.continuity.enabled
    made = []
    for _ in range(2):
        client = async_client(redis_url)
        made.append(
            RealtimeHub(None, profile, QuotaService(Tenants(path, client), Buckets(client, prefix=prefix)))
        )
    yield made
    for hub in made:
        for task in (hub._board, hub._drain_watch):
            if task is not None:
                task.cancel()


class Client:
    """What one connection was sent."""

    def __init__(self):
        self.events: list = []

    async def send(self, event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


async def test_a_draining_replica_moves_its_sessions_with_their_conversation(gateways):
    leaving, staying = gateways
    first = Client()
    session = await leaving.open("sk-capped", None, first.send)
    await session.handle({"type": "session.update", "session": {
        "type": "realtime", "output_modalities": ["text"], "instructions": "Be terse."}})  # fmt: skip
    for text in ("first question", "second question"):
        await session.handle({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})  # fmt: skip
    items = [e.item.id for e in first.of(se.ConversationItemDone)]
    assert len(items) == 2

    await leaving.drain()  # no response in flight: this is the turn boundary
    moved = first.of(se.SessionMigrate)
    assert [(m.session_id, m.reason) for m in moved] == [(session.id, "server_draining")]
    assert session.ended.done() and session.moved
    await leaving.close(session)  # the transport closes (WebSocket 1012)

    # The tenant's one slot is kept for the reconnect, which another replica serves.
    second = Client()
    resumed = await asyncio.wait_for(staying.open("sk-capped", None, second.send, resume=session.id), 10)
    assert resumed.id == session.id
    (back,) = second.of(se.SessionResumed)
    assert [i.id for i in back.items] == items
    assert [i.content[0].text for i in back.items] == ["first question", "second question"]
    assert resumed.config.instructions == "Be terse." and resumed.config.output_modalities == ["text"]
    assert not resumed.moved  # the replica it moved to is not draining
    with pytest.raises(Refused):  # still one session for the tenant
        await staying.open("sk-capped", None, Client().send)
    await staying.close(resumed)


async def test_a_session_without_continuity_stays_until_its_replica_stops(gateways, monkeypatch):
    leaving, _ = gateways
    monkeypatch.setattr(leaving.profile.realtime.continuity, "enabled", False)
    client = Client()
    session = await leaving.open("sk-capped", None, client.send)
    await leaving.drain()
    assert not client.of(se.SessionMigrate) and not session.ended.done()
    await leaving.close(session)
