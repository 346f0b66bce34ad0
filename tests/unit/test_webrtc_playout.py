"""The WebRTC transport's playout track (services/gateway/realtime/webrtc.py), frame by frame: answers are
paced out in 20 ms frames with silence between them, their progress reported as played, started /
stopped / cleared as the data channel tells them; and how an offer is read (its body, or OpenAI's
form with session settings) and checked before any parsing."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from services.common.errors import OmniError
from services.gateway.realtime.pacing import MAX_LATE_S, FramePacer
from services.gateway.realtime.webrtc import FRAME_SAMPLES, Call, Playout, read_offer
from services.realtime import server_events as se
from services.realtime.codecs import PCM_RATE


def _tone(frames: float) -> bytes:
    return (np.full(int(frames * FRAME_SAMPLES), 1000, "<i2")).tobytes()


class Seen:
    def __init__(self):
        self.progress: list[tuple[str, float]] = []
        self.events: list[se.ServerEvent] = []

    def kinds(self) -> list[str]:
        return [e.type for e in self.events]


@pytest.fixture
def playout():
    seen = Seen()
    return Playout(lambda item, ms: seen.progress.append((item, ms)), seen.events.append), seen


async def _frames(track: Playout, n: int) -> list[np.ndarray]:
    return [(await track.recv()).to_ndarray().reshape(-1) for _ in range(n)]


async def test_an_answer_plays_in_real_time_between_silences(playout):
    track, seen = playout
    track.push("resp_1", "item_1", _tone(2.5))
    track.finish("resp_1")
    frames = await _frames(track, 5)
    assert [bool(f.any()) for f in frames] == [True, True, True, False, False]
    assert all(len(f) == FRAME_SAMPLES for f in frames)
    assert seen.progress[-1] == ("item_1", pytest.approx(2.5 * FRAME_SAMPLES / PCM_RATE * 1000))
    assert seen.kinds() == ["output_audio_buffer.started", "output_audio_buffer.stopped"]
    assert all(e.response_id == "resp_1" for e in seen.events)


async def test_frames_are_paced_at_real_time():
    track = Playout(lambda *_: None, lambda _: None)
    start = time.monotonic()
    await _frames(track, 26)
    assert (
        0.49 <= time.monotonic() - start < 0.8
    )  # 25 periods of 20 ms after the first (a busy machine: later)


def test_a_sender_a_little_late_catches_up_one_far_behind_goes_on_from_now():
    skipped: list[float] = []
    pacer = FramePacer(PCM_RATE, on_late=skipped.append)
    assert pacer.delay(0.0) == 0.0
    assert pacer.delay(0.0) == pytest.approx(0.02)
    # 60 ms late (frame 2 due at 0.04): the frames it missed go out at once, then the grid goes on
    assert [pacer.delay(0.1) for _ in range(5)] == [0.0, 0.0, 0.0, 0.0, pytest.approx(0.02)]
    assert skipped == []
    # stalled for a second (frame 7 due at 0.14): it goes on from now, one frame at a time
    assert pacer.delay(1.2) == 0.0
    assert pacer.delay(1.2) == pytest.approx(0.02)
    assert skipped == [pytest.approx(1.2 - 0.14)]


@given(st.lists(st.floats(0.0, 2.0), min_size=1, max_size=200))
def test_frames_never_go_out_ahead_of_real_time_nor_in_a_burst_over_the_late_bound(stalls):
    """A sender that asks for a frame, waits what it is told, sends, and then is held up for a
    while (its process starved): frame k goes out no earlier than k frames after the first (plus
    the time skipped), no more than MAX_LATE_S after it was due, and at most MAX_LATE_S's worth of
    frames (and one) go out at one instant."""
    skipped: list[float] = []
    pacer, period = FramePacer(PCM_RATE, on_late=skipped.append), 0.02
    now, sent = 0.0, []
    for stall in stalls:
        sent.append(now + pacer.delay(now))
        due = sent[0] + (len(sent) - 1) * period + sum(skipped)
        assert -1e-9 <= sent[-1] - due <= MAX_LATE_S + 1e-9
        now = sent[-1] + stall
    burst = max(sum(1 for t in sent if abs(t - at) < 1e-9) for at in sent)
    assert burst <= MAX_LATE_S / period + 1 + 1e-9


async def test_a_starved_playout_delays_the_answer_rather_than_bursting_it():
    late: list[float] = []
    track = Playout(lambda *_: None, lambda _: None, late.append)
    track.push("resp_1", "item_1", _tone(10))
    await _frames(track, 2)
    time.sleep(0.5)  # the gateway's event loop held up
    start = time.monotonic()
    frames = await _frames(track, 4)
    assert all(f.any() for f in frames)  # nothing of the answer skipped
    assert time.monotonic() - start >= 0.059  # one frame now, three 20 ms apart: not a burst
    assert sum(late) >= 0.4


async def test_answers_back_to_back_each_start_and_stop(playout):
    track, seen = playout
    track.push("resp_1", "item_1", _tone(1.5))
    track.finish("resp_1")
    track.push("resp_2", "item_2", _tone(1))
    track.finish("resp_2")
    track.finish("resp_3")  # no audio (a text answer): never starts, never stops
    await _frames(track, 4)
    assert [(e.type.rsplit(".", 1)[1], e.response_id) for e in seen.events] == [
        ("started", "resp_1"), ("stopped", "resp_1"), ("started", "resp_2"), ("stopped", "resp_2")]  # fmt: skip
    assert [item for item, _ in seen.progress] == ["item_1", "item_1", "item_2"]


async def test_an_answer_not_finished_keeps_playing_as_audio_arrives(playout):
    track, seen = playout
    track.push("resp_1", "item_1", _tone(1))
    await _frames(track, 2)  # ran dry: silence, but not stopped
    assert seen.kinds() == ["output_audio_buffer.started"]
    track.push("resp_1", "item_1", _tone(1))
    track.finish("resp_1")
    assert (await _frames(track, 1))[0].any()
    assert seen.progress[-1][1] == pytest.approx(2 * FRAME_SAMPLES / PCM_RATE * 1000)
    await _frames(track, 1)
    assert seen.kinds() == ["output_audio_buffer.started", "output_audio_buffer.stopped"]


async def test_clearing_an_item_drops_what_was_not_played(playout):
    track, seen = playout
    track.push("resp_1", "item_1", _tone(10))
    await _frames(track, 2)
    assert track.clear("item_1") == "resp_1"
    assert not any(f.any() for f in await _frames(track, 3))
    assert seen.progress[-1][1] == pytest.approx(2 * FRAME_SAMPLES / PCM_RATE * 1000)
    assert track.clear("item_1") is None  # nothing left to cut
    # the next answer starts afresh
    track.push("resp_2", "item_2", _tone(1))
    assert (await _frames(track, 1))[0].any()
    assert seen.events[-1] == se.OutputAudioBufferStarted(
        response_id="resp_2", event_id=seen.events[-1].event_id
    )


def _form(*parts: tuple[str, str | None, bytes, str]) -> tuple[bytes, Headers]:
    """A multipart body of (name, filename, data, content type) parts, as the OpenAI SDK sends one."""
    boundary = "omniray-test-boundary"
    body = b""
    for name, filename, data, content_type in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += (f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
                 f"Content-Type: {content_type}\r\n\r\n").encode() + data + b"\r\n"  # fmt: skip
    body += f"--{boundary}--\r\n".encode()
    return body, Headers({"content-type": f"multipart/form-data; boundary={boundary}"})


OFFER = b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"


def _sdp(content_type: str, body: bytes = OFFER) -> tuple[bytes, Headers]:
    return body, Headers({"content-type": content_type})


@pytest.mark.parametrize(
    ("request_", "status", "code"),
    [
        (_sdp("text/plain"), 415, "unsupported_media_type"),
        (_sdp("application/sdp", b"v=0\r\nm=audio " + b"x" * 70_000), 413, "request_too_large"),
        (_sdp("application/sdp", b"\xff\xfe"), 400, "invalid_sdp"),
        (_sdp("application/sdp", b"v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"), 400, "invalid_sdp"),
        (_form(("session", None, b"{}", "application/json")), 400, "invalid_request"),
        (_form(("sdp", None, OFFER, "application/sdp"), ("session", None, b"{nope", "application/json")), 400, "invalid_json"),
        (_form(("sdp", None, OFFER, "application/sdp"), ("session", None, b"[1]", "application/json")), 400, "invalid_request"),
        (_form(("sdp", None, OFFER, "application/sdp"), ("voice", None, b"marin", "text/plain")), 400, "unknown_parameter"),
        (_form(("sdp", None, b"v=0\r\n", "application/sdp")), 400, "invalid_sdp"),
        (_form(("sdp", None, OFFER, "application/sdp"), ("sdp", None, OFFER, "application/sdp")), 400, "invalid_request"),
        (_form(("sdp", None, b"\xff\xfe m=audio 9 x", "application/sdp")), 400, "invalid_sdp"),  # no m= line
        ((b"--x\r\nContent-Disposition: form-data\r\n\r\nno name\r\n--x--\r\n", Headers({"content-type": "multipart/form-data; boundary=x"})), 400, "invalid_form"),
        (_form(("session", None, b"x" * (300 * 1024), "application/json")), 400, "invalid_form"),
    ],
)  # fmt: skip
def test_offers_refused_before_parsing(request_, status, code):
    with pytest.raises(OmniError) as refused:
        asyncio.run(read_offer(*request_))
    assert (refused.value.status, refused.value.code) == (status, code)


def test_an_offer_comes_as_its_body_or_in_openais_form():
    assert asyncio.run(read_offer(*_sdp("application/SDP; charset=utf-8"))) == (OFFER.decode(), None)
    settings = b'{"type": "realtime", "instructions": "Be brief."}'
    for sdp_filename in (None, "offer.sdp"):  # a field (the SDK's) or a file (curl -F sdp=@offer.sdp)
        body, headers = _form(
            ("sdp", sdp_filename, OFFER, "application/sdp"), ("session", None, settings, "application/json")
        )
        assert asyncio.run(read_offer(body, headers)) == (
            OFFER.decode(),
            {"type": "realtime", "instructions": "Be brief."},
        )
    assert asyncio.run(read_offer(*_form(("sdp", None, OFFER, "application/sdp")))) == (OFFER.decode(), None)


class _Channel:
    """A data channel that, as aiortc's, refuses a message over the peer's size."""

    readyState = "open"

    def __init__(self, limit: int):
        self.limit, self.sent = limit, []

    def send(self, text: str) -> None:
        if len(text) > self.limit:
            raise ValueError("over the remote party's message size")
        self.sent.append(text)


async def test_an_event_over_the_channels_message_size_is_reported_and_the_call_goes_on():
    call = Call(pc=None, metrics=None)
    call.channel = _Channel(limit=2000)
    big = se.Item(id="item_1", role="user", content=[se.Content(type="input_text", text="x" * 5000)])
    call._emit(se.ConversationItemRetrieved(item=big))
    call._emit(se.SessionMigrate(session_id="sess_1"))
    assert (
        '"event_too_large"' in call.channel.sent[0]
        and "conversation.item.retrieved event" in call.channel.sent[0]
    )
    assert '"omniray.session.migrate"' in call.channel.sent[1]
    assert not call.over.is_set()


async def test_a_call_over_serves_nothing_still_queued():
    """The transport's receive: client events and microphone chunks in order while the call lives;
    once it is over (hung up, peer gone) nothing still queued reaches the session."""
    call = Call(pc=None, metrics=None)
    call.pending.put_nowait(("event", '{"type": "input_audio_buffer.clear"}'))
    call.pending.put_nowait(("audio", b"\x00\x00" * 960))
    assert await call.receive() == '{"type": "input_audio_buffer.clear"}'
    assert (await call.receive()).pcm16 == b"\x00\x00" * 960
    call.pending.put_nowait(("audio", b"\x00\x00" * 960))
    call.over.set()
    assert await call.receive() is None
