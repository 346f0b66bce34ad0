"""Server VAD: the streaming Silero runner gives the same probabilities however the audio is
chunked; the turn segmenter alternates start/stop with OpenAI's padding and silence rules."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.clients.speech import speech
from services.realtime.vad import WINDOW_MS, ServerVad, SileroStream, TurnSegmenter

RATE = 24_000


def _pcm(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def spoken() -> tuple[bytes, float, float]:
    """1 s of silence, a spoken sentence, 1.5 s of silence (24 kHz pcm16), and the speech's span."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng to speak")
    voice = np.frombuffer(speech("Hello there, how are you doing today?", RATE), "<i2") / 32768.0
    audio = np.concatenate([np.zeros(RATE), voice, np.zeros(int(1.5 * RATE))])
    return _pcm(audio), 1000.0, 1000.0 + len(voice) / RATE * 1000


def test_speech_is_found_between_its_silences(spoken):
    pcm, begin, end = spoken
    events = TurnSegmenter(ServerVad(prefix_padding_ms=0)).push(SileroStream(RATE).feed(pcm))
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"]
    assert begin - 100 <= events[0].audio_ms <= begin + 300
    assert begin < events[1].audio_ms <= end + 100


def test_silence_and_a_hum_are_not_speech():
    t = np.arange(2 * RATE) / RATE
    for audio in (np.zeros(2 * RATE), 0.25 * np.sin(2 * np.pi * 180 * t)):
        assert TurnSegmenter(ServerVad()).push(SileroStream(RATE).feed(_pcm(audio))) == []


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 4000), min_size=1, max_size=40))
def test_chunking_does_not_change_the_probabilities(spoken, sizes):
    pcm = spoken[0]
    whole = SileroStream(RATE).feed(pcm)
    stream, parts, at = SileroStream(RATE), [], 0
    for size in sizes * (len(pcm) // (2 * sum(sizes)) + 1):
        parts.append(stream.feed(pcm[at : at + 2 * size]))
        at += 2 * size
        if at >= len(pcm):
            break
    np.testing.assert_allclose(np.concatenate(parts)[: len(whole)], whole, atol=1e-5)


PROBS = st.lists(st.floats(0, 1), max_size=300)


@given(PROBS, st.integers(0, 600), st.integers(0, 1500), st.floats(0, 10_000))
def test_segments_alternate_and_respect_padding_and_silence(probs, padding, silence, origin):
    params = ServerVad(prefix_padding_ms=padding, silence_duration_ms=silence)
    events = TurnSegmenter(params, origin_ms=origin).push(np.array(probs))
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"] * (len(events) // 2) + (
        ["speech_started"] if len(events) % 2 else []
    )
    positions = [e.audio_ms for e in events]
    assert all(p >= int(origin) for p in positions)
    for started, stopped in zip(events[::2], events[1::2], strict=False):
        assert stopped.audio_ms > started.audio_ms
    for stopped, started in zip(events[1::2], events[2::2], strict=False):
        # speech resumes only after a full silence: no overlap with the turn before
        assert started.audio_ms + padding >= stopped.audio_ms + silence - WINDOW_MS


@given(PROBS, st.integers(1, 50))
def test_segmenting_in_pieces_equals_segmenting_at_once(probs, cut):
    probs = np.array(probs, np.float32)
    whole = TurnSegmenter(ServerVad()).push(probs)
    seg = TurnSegmenter(ServerVad())
    pieces = [e for k in range(0, len(probs), cut) for e in seg.push(probs[k : k + cut])]
    assert pieces == whole
