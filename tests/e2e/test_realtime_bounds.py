"""A realtime session on the tiny deployment runs as long as its client likes (issue 15, part 7): an
open microphone in a quiet room streams for minutes with no error and a buffer of the prefix padding,
and a conversation longer than its window (turns, or the context length) keeps being answered."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from loadtest.clients.realtime_client import RealtimeClient
from loadtest.clients.speech import speech
from services.realtime.server_events import WHOLE
from tests.e2e.test_realtime import _assert_scraped, realtime

PCM_RATE = 24_000
MANUAL = {"type": "realtime", "max_output_tokens": 16, "audio": {"input": {"turn_detection": None}}}


def _tone(seconds: float, freq: float = 180.0) -> bytes:
    t = np.arange(int(seconds * PCM_RATE)) / PCM_RATE
    return (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()


def _update(r: RealtimeClient, session: dict) -> int:
    at = r.mark()
    r.send({"type": "session.update", "session": {"type": "realtime", **session}})
    return r.wait("session.updated", at)


def _turn(r: RealtimeClient, pcm: bytes) -> dict:
    """A manual turn: its audio, commit, a response; the `response.done` event."""
    at = r.mark()
    r.append(pcm)
    r.send({"type": "input_audio_buffer.commit"})
    r.send({"type": "response.create"})
    return r.event(r.wait("response.done", at, timeout=120))


def _kinds(r: RealtimeClient, prefix: str) -> list[dict]:
    return [e for _, e in r.events if e["type"].startswith(prefix)]


def _buffer_tokens(r: RealtimeClient) -> int:
    """Prompt tokens of a response to what the input buffer holds now (as a manual commit)."""
    _update(r, MANUAL)
    at = r.mark()
    r.send({"type": "input_audio_buffer.commit"})
    r.send({"type": "response.create"})
    done = r.event(r.wait("response.done", at, timeout=120))
    assert done["response"]["status"] in WHOLE
    return done["response"]["usage"]["input_tokens"]


def _reference_tokens(omniray, model_name, seconds: float) -> int:
    """Prompt tokens of a fresh session's response to `seconds` of committed audio."""
    with realtime(omniray, model_name) as r:
        r.wait("session.created")
        _update(r, MANUAL)
        r.append(bytes(int(seconds * PCM_RATE) * 2))
        return _buffer_tokens(r)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng to speak")
def test_an_open_microphone_in_a_quiet_room_streams_for_minutes(omniray, model_name):
    """200 s of a quiet room, sent as fast as the server takes it (past the 120 s buffer limit): no
    error, no speech, and the buffer then holds no more than half a second (compared by the prompt
    tokens of a response to it); a question after it is a turn at the right position."""
    seconds = 200
    rng = np.random.default_rng(0)
    with realtime(omniray, model_name) as r:
        r.wait("session.created")
        _update(r, {"max_output_tokens": 16})  # server VAD on: the default
        for _ in range(seconds):
            r.append(rng.normal(0, 30, PCM_RATE).astype("<i2").tobytes())
        _update(r, {})  # every append before it has been handled
        assert _kinds(r, "error") == [] and _kinds(r, "input_audio_buffer.") == []
        held = _buffer_tokens(r)  # the buffer as a manual turn, the conversation's first

        _update(r, {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
        at = r.mark()
        r.append(speech("What is the weather like in Paris today?") + bytes(PCM_RATE * 2))
        started = r.event(r.wait("input_audio_buffer.speech_started", at))
        done = r.event(r.wait("response.done", at, timeout=120))
        assert done["response"]["status"] in WHOLE
        assert seconds * 1000 <= started["audio_start_ms"] <= seconds * 1000 + 500
        assert _kinds(r, "error") == []
    reference = _reference_tokens(omniray, model_name, 0.5)
    assert held <= reference, (held, reference)


def test_a_conversation_longer_than_its_window_is_still_answered(omniray, model_name):
    """tiny keeps 4 turns (ratio 0.75): 7 turns are all answered; the 5th drops the oldest two, so its
    prompt is shorter than the 4th's; a dropped item is gone; the drops are counted."""
    with realtime(omniray, model_name) as r:
        r.wait("session.created")
        _update(r, MANUAL)
        done = [_turn(r, _tone(0.5, 150 + 20 * k)) for k in range(7)]
        assert len(done) == 7 and all(d["response"]["status"] in WHOLE for d in done)
        tokens = [d["response"]["usage"]["input_tokens"] for d in done]
        assert tokens[0] < tokens[1] < tokens[2] < tokens[3] and tokens[4] < tokens[3], tokens
        assert _kinds(r, "error") == []
        first_user = next(e for _, e in r.events if e["type"] == "input_audio_buffer.committed")["item_id"]
        r.send({"type": "conversation.item.retrieve", "item_id": first_user})
        error = r.event(r.wait("error"))
        assert error["error"]["code"] == "item_not_found"
    _assert_scraped(omniray, ["ray_omniray_realtime_history_turns_dropped_total"])


def test_a_conversation_at_the_context_length_is_still_answered(omniray, model_name):
    """Long instructions leave room for about three 14 s turns in tiny's 4096 tokens: the oldest
    turns go before a request would pass the context length (the 4th turn is already shorter than
    the 3rd, before the 4-turn limit could have dropped anything); every turn is answered."""
    with realtime(omniray, model_name) as r:
        r.wait("session.created")
        _update(r, {**MANUAL, "instructions": "hello " * 700})
        done = [_turn(r, _tone(14.0, 150 + 20 * k)) for k in range(6)]
        assert _kinds(r, "error") == []
        assert len(done) == 6 and all(d["response"]["status"] in WHOLE for d in done)
        tokens = [d["response"]["usage"]["input_tokens"] for d in done]
        assert tokens[0] < tokens[1] < tokens[2] and tokens[3] < tokens[2], tokens
        assert all(t + 16 <= 4096 for t in tokens), tokens
