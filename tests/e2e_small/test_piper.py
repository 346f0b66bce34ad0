"""Piper split into talker (front end) and vocoder (decoder): the vocoder's chunked output, cut by
the gateway's VocoderWindow with the profile's context, equals a whole-utterance decode."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.models.profile import load_profile
from services.pipeline.vocoder_window import VocoderWindow
from tests.conftest import load_adapter

PROFILE = load_profile("small")
pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the talker needs espeak-ng")


@pytest.fixture(scope="module")
def utterance():
    talker = load_adapter("small", "talker")
    chunks = list(talker.stream_units("The capital of France is Paris, a city on the Seine.", "joe"))
    vocoder = load_adapter("small", "vocoder")
    units = np.concatenate(chunks)
    return chunks, units, vocoder, vocoder.decode(units, None, None, "joe")


def test_talker_streams_latent_frames(utterance):
    chunks, units, vocoder, whole = utterance
    assert len(chunks) >= 2 and units.ndim == 2 and units.dtype == np.float32
    assert len(whole) == len(units) * vocoder.hop
    assert 1.5 < len(whole) / vocoder.sample_rate < 8  # a sentence, not silence or noise
    assert np.abs(whole).max() > 0.05


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 90), min_size=1, max_size=12))
def test_chunked_decode_equals_whole_decode(utterance, sizes):
    _, units, vocoder, whole = utterance
    spec = PROFILE.models.vocoder
    window = VocoderWindow(spec.context_frames, spec.lookahead_frames)
    calls, start = [], 0
    for size in sizes:
        if start < len(units):
            calls.append(window.push(units[start : start + size]))
            start += size
    if start < len(units):
        calls.append(window.push(units[start:]))
    calls.append(window.flush())
    pieces = [vocoder.decode(c.units, c.left, c.right, "joe") for c in calls if c]
    chunked = np.concatenate(pieces)
    assert chunked.shape == whole.shape
    assert np.abs(chunked - whole).max() <= 1e-3
