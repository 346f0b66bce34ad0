"""A realtime session on the tiny deployment runs as long as its client likes (issue 15, part 7): an
open microphone in a quiet room streams for minutes with no error and a buffer of the prefix padding,
and a conversation longer than its window (turns, or the context length) keeps being answered."""

from __future__ import annotations

import base64
import json
import shutil

import numpy as np
import pytest

from loadtest.speech import speech
from tests.e2e.test_realtime import Reader, _assert_scraped, _connect

PCM_RATE = 24_000
MANUAL = {"type": "realtime", "max_output_tokens": 16, "audio": {"input": {"turn_detection": None}}}


def _append(pcm: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def _tone(seconds: float, freq: float = 180.0) -> bytes:
    t = np.arange(int(seconds * PCM_RATE)) / PCM_RATE
    return (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()


def _update(conn, r: Reader, session: dict) -> int:
    at = len(r.events)
    conn.send(json.dumps({"type": "session.update", "session": {"type": "realtime", **session}}))
    return r.wait("session.updated", at)


def _turn(conn, r: Reader, pcm: bytes) -> dict:
    """A manual turn: its audio, commit, a response; the `response.done` event."""
    at = len(r.events)
    conn.send(_append(pcm))
    conn.send(json.dumps({"type": "input_audio_buffer.commit"}))
    conn.send(json.dumps({"type": "response.create"}))
    return r.events[r.wait("response.done", at, timeout=120)][1]


def _kinds(r: Reader, prefix: str) -> list[dict]:
    return [e for _, e in r.events if e["type"].startswith(prefix)]


def _buffer_tokens(conn, r: Reader) -> int:
    """Prompt tokens of a response to what the input buffer holds now (as a manual commit)."""
    _update(conn, r, MANUAL)
    at = len(r.events)
    conn.send(json.dumps({"type": "input_audio_buffer.commit"}))
    conn.send(json.dumps({"type": "response.create"}))
    done = r.events[r.wait("response.done", at, timeout=120)][1]
    assert done["response"]["status"] == "completed"
    return done["response"]["usage"]["input_tokens"]


def _reference_tokens(omniray, model_name, seconds: float) -> int:
    """Prompt tokens of a fresh session's response to `seconds` of committed audio."""
    conn = _connect(omniray, model_name)
    r = Reader(conn)
    try:
        r.wait("session.created")
        _update(conn, r, MANUAL)
        conn.send(_append(bytes(int(seconds * PCM_RATE) * 2)))
        return _buffer_tokens(conn, r)
    finally:
        conn.close()


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng to speak")
def test_an_open_microphone_in_a_quiet_room_streams_for_minutes(omniray, model_name):
    """200 s of a quiet room, sent as fast as the server takes it (past the 120 s buffer limit): no
    error, no speech, and the buffer then holds no more than half a second (compared by the prompt
    tokens of a response to it); a question after it is a turn at the right position."""
    seconds = 200
    rng = np.random.default_rng(0)
    conn = _connect(omniray, model_name)
    r = Reader(conn)
    try:
        r.wait("session.created")
        _update(conn, r, {"max_output_tokens": 16})  # server VAD on: the default
        for _ in range(seconds):
            conn.send(_append(rng.normal(0, 30, PCM_RATE).astype("<i2").tobytes()))
        _update(conn, r, {})  # every append before it has been handled
        assert _kinds(r, "error") == [] and _kinds(r, "input_audio_buffer.") == []
        held = _buffer_tokens(conn, r)  # the buffer as a manual turn, the conversation's first

        _update(conn, r, {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
        at = len(r.events)
        conn.send(_append(speech("What is the weather like in Paris today?") + bytes(PCM_RATE * 2)))
        started = r.events[r.wait("input_audio_buffer.speech_started", at)][1]
        done = r.events[r.wait("response.done", at, timeout=120)][1]
        assert done["response"]["status"] == "completed"
        assert seconds * 1000 <= started["audio_start_ms"] <= seconds * 1000 + 500
        assert _kinds(r, "error") == []
    finally:
        conn.close()
    reference = _reference_tokens(omniray, model_name, 0.5)
    assert held <= reference, (held, reference)


def test_a_conversation_longer_than_its_window_is_still_answered(omniray, model_name):
    """tiny keeps 4 turns (ratio 0.75): 7 turns are all answered; the 5th drops the oldest two, so its
    prompt is shorter than the 4th's; a dropped item is gone; the drops are counted."""
    conn = _connect(omniray, model_name)
    r = Reader(conn)
    try:
        r.wait("session.created")
        _update(conn, r, MANUAL)
        done = [_turn(conn, r, _tone(0.5, 150 + 20 * k)) for k in range(7)]
        assert [d["response"]["status"] for d in done] == ["completed"] * 7
        tokens = [d["response"]["usage"]["input_tokens"] for d in done]
        assert tokens[0] < tokens[1] < tokens[2] < tokens[3] and tokens[4] < tokens[3], tokens
        assert _kinds(r, "error") == []
        first_user = next(e for _, e in r.events if e["type"] == "input_audio_buffer.committed")["item_id"]
        conn.send(json.dumps({"type": "conversation.item.retrieve", "item_id": first_user}))
        error = r.events[r.wait("error")][1]
        assert error["error"]["code"] == "item_not_found"
    finally:
        conn.close()
    _assert_scraped(omniray, ["ray_omniray_realtime_history_turns_dropped_total"])


def test_a_conversation_at_the_context_length_is_still_answered(omniray, model_name):
    """Long instructions leave room for about three 14 s turns in tiny's 4096 tokens: the oldest
    turns go before a request would pass the context length (the 4th turn is already shorter than
    the 3rd, before the 4-turn limit could have dropped anything); every turn is answered."""
    conn = _connect(omniray, model_name)
    r = Reader(conn)
    try:
        r.wait("session.created")
        _update(conn, r, {**MANUAL, "instructions": "hello " * 700})
        done = [_turn(conn, r, _tone(14.0, 150 + 20 * k)) for k in range(6)]
        assert _kinds(r, "error") == []
        assert [d["response"]["status"] for d in done] == ["completed"] * 6
        tokens = [d["response"]["usage"]["input_tokens"] for d in done]
        assert tokens[0] < tokens[1] < tokens[2] and tokens[3] < tokens[2], tokens
        assert all(t + 16 <= 4096 for t in tokens), tokens
    finally:
        conn.close()
