"""The one loop every realtime transport runs (services/gateway/realtime/transport.py), through a
transport that scripts its client: events, audio and undecodable bytes reach the session in order;
the session ends as the client leaves, idles (told with an `error` first, never while a response
plays), moves or is taken over, and the transport is closed with that reason. WebSocket, gRPC and
WebRTC run it end to end in tests/e2e (test_realtime_protocol, test_client_faults, test_webrtc)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from services.gateway.realtime.transport import Audio, Invalid, serve
from services.realtime import events as ev


class Session:
    """What the loop reads of a session, recording what it is given."""

    def __init__(self, idle_s: float = 5.0, busy: bool = False):
        self.profile = SimpleNamespace(realtime=SimpleNamespace(idle_timeout_s=idle_s))
        self.ended = asyncio.get_running_loop().create_future()
        self.moved = False
        self.busy = busy
        self.got: list = []
        self.sent: list = []

    async def handle(self, raw) -> None:
        self.got.append(("event", raw))

    async def handle_invalid(self, why: str) -> None:
        self.got.append(("invalid", why))

    async def append_audio(self, pcm16: bytes) -> None:
        if pcm16 == b"bad":
            raise ev.RealtimeEventError("too much audio", code="input_audio_buffer_full")
        self.got.append(("audio", pcm16))

    async def send(self, event) -> None:
        self.sent.append(event)


class Scripted:
    def __init__(self, messages: list, then_wait: bool = False):
        self.messages, self.then_wait, self.closed = list(messages), then_wait, None

    async def receive(self):
        if self.messages:
            return self.messages.pop(0)
        if self.then_wait:
            await asyncio.Event().wait()
        return None

    async def send(self, event) -> None: ...

    async def close(self, ending) -> None:
        self.closed = ending


async def test_messages_reach_the_session_in_order_until_the_client_leaves():
    session, transport = Session(), Scripted(['{"type": "x"}', Audio(b"pcm"), Invalid("corrupt"), b"{}"])
    assert await serve(session, transport) == "client_left" and transport.closed == "client_left"
    assert session.got == [
        ("event", '{"type": "x"}'),
        ("audio", b"pcm"),
        ("invalid", "corrupt"),
        ("event", b"{}"),
    ]


async def test_bad_audio_is_reported_once_a_second_and_the_session_goes_on():
    session = Session()
    await serve(session, Scripted([Audio(b"bad"), Audio(b"bad"), Audio(b"ok")]))
    assert [e.error.code for e in session.sent] == ["input_audio_buffer_full"]
    assert session.got == [("audio", b"ok")]


async def test_an_idle_session_is_told_then_closed_but_not_while_a_response_plays():
    session = Session(idle_s=0.05)
    assert await serve(session, Scripted([], then_wait=True)) == "idle"
    assert [e.error.code for e in session.sent] == ["session_idle_timeout"]
    busy, transport = Session(idle_s=0.05, busy=True), Scripted([], then_wait=True)
    task = asyncio.create_task(serve(busy, transport))
    await asyncio.sleep(0.2)
    assert not task.done() and busy.sent == []
    busy.busy = False
    assert await task == "idle"


async def test_a_moved_or_taken_session_closes_its_transport_with_the_reason():
    for moved, ending in ((True, "moved"), (False, "taken")):
        session, transport = Session(), Scripted([], then_wait=True)
        task = asyncio.create_task(serve(session, transport))
        await asyncio.sleep(0.01)
        session.moved = moved
        session.ended.set_result(None)
        assert await task == ending and transport.closed == ending
        assert session.sent == []  # no idle error: the session ended for its own reason
