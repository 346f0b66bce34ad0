"""Telephony audio at the realtime edge: G.711 μ-law / A-law at 8 kHz in and out, converted to and
from the session's pcm16 at 24 kHz chunk by chunk (state kept across chunks), the tone and its
length kept; pcm passes as it is."""

from __future__ import annotations

import numpy as np
import pytest

from services.realtime import events as ev
from services.realtime.codecs import G711_RATE, PCM_RATE, InputAudio, OutputAudio


def _tone(rate: int, seconds: float, hz: float = 400.0) -> np.ndarray:
    return (np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate) * 10_000).astype("<i2")


def _peak_hz(pcm: np.ndarray, rate: int) -> float:
    window = pcm[len(pcm) // 4 : len(pcm) // 4 + rate // 2].astype(float)
    return float(np.argmax(np.abs(np.fft.rfft(window)))) * 2  # half a second: bin k is 2k Hz


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
def test_g711_round_trip_in_chunks_keeps_the_tone(fmt):
    speech = _tone(PCM_RATE, 1.0).tobytes()
    out = OutputAudio(fmt)
    chunks = [speech[i : i + 4_802] for i in range(0, len(speech), 4_802)]  # odd sample counts too
    wire = b"".join(out.encode(c) for c in chunks) + out.flush()
    assert len(wire) == G711_RATE  # one byte a sample, 8 kHz, nothing lost at chunk edges
    assert _peak_hz(np.frombuffer(wire, np.uint8).astype(float) - 128, G711_RATE) != 0  # not silence
    back = InputAudio(fmt)
    pcm = np.frombuffer(b"".join(back.decode(wire[i : i + 333]) for i in range(0, len(wire), 333)), "<i2")
    assert abs(len(pcm) - PCM_RATE) < 64  # the resampler holds a few samples back
    assert _peak_hz(pcm, PCM_RATE) == 400.0
    assert np.abs(pcm[PCM_RATE // 4 : PCM_RATE // 2].astype(int)).max() > 8_000


def test_pcm_passes_as_it_is_and_must_be_whole_samples():
    pcm = _tone(PCM_RATE, 0.1).tobytes()
    assert InputAudio("audio/pcm").decode(pcm) == pcm
    out = OutputAudio("audio/pcm")
    assert out.encode(pcm) == pcm and out.flush() == b""
    with pytest.raises(ev.RealtimeEventError, match="even number"):
        InputAudio("audio/pcm").decode(b"\x00\x01\x02")
    assert InputAudio("audio/pcmu").decode(b"\x7f\x7f\x7f") is not None  # one byte a sample


def test_the_format_says_its_rate():
    assert ev.AudioFormat(type="audio/pcmu").rate is None
    assert ev.AudioFormat().rate == 24_000
    with pytest.raises(ValueError):
        ev.AudioFormat(type="audio/opus")
