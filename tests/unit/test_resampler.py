"""Speech out at 24 kHz: a response's chunks resampled one by one join into the whole answer
resampled at once (no clicks or gaps at chunk edges), with the length and pitch the rates imply."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.pipeline.resampler import OUTPUT_RATE, StreamResampler

PIPER_RATE = 22_050


def _tone(rate: int, seconds: float, hz: float = 440.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * hz * t) * 12_000).astype("<i2").tobytes()


def _through(chunks: list[bytes], rate: int) -> bytes:
    r = StreamResampler(rate)
    return b"".join(r.push(c) for c in chunks) + r.flush()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 22_050), max_size=12))
def test_chunked_equals_whole(cuts):
    pcm = _tone(PIPER_RATE, 1.0)
    edges = sorted({2 * c for c in cuts})  # in bytes, on sample boundaries
    chunks = [pcm[a:b] for a, b in zip([0, *edges], [*edges, len(pcm)], strict=True)]
    assert _through(chunks, PIPER_RATE) == _through([pcm], PIPER_RATE)


def test_length_and_pitch_follow_the_rates():
    out = np.frombuffer(_through([_tone(PIPER_RATE, 2.0)], PIPER_RATE), "<i2")
    assert len(out) == 2 * OUTPUT_RATE
    spectrum = np.abs(np.fft.rfft(out[OUTPUT_RATE // 2 : OUTPUT_RATE // 2 + OUTPUT_RATE]))
    assert np.argmax(spectrum) == 440  # 1 s at 24 kHz: bin k is k Hz


def test_audio_at_the_output_rate_passes_through():
    pcm = _tone(OUTPUT_RATE, 0.1)
    r = StreamResampler(OUTPUT_RATE)
    assert r.push(pcm) == pcm and r.flush() == b""
