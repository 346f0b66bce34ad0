"""Qwen3-Omni's code2wav as the vocoder stage (services/models/qwen3_omni/code2wav.py) on
`qwen3-omni-tiny`: decoded in chunks with 72 frames of left context and 1 of lookahead — as the
pipeline's vocoder window hands them — it equals a whole decode within 1e-3 of the peak, and the
length is 1920 samples a frame at 24 kHz. (Random weights give near-silent audio, ~1e-6: the
comparison is relative to the whole decode's peak.)"""

from __future__ import annotations

import numpy as np
import pytest

from services.models.profile import load_profile
from services.models.registry import ADAPTERS

FRAMES, CHUNK, CONTEXT, LOOKAHEAD, TOLERANCE = 120, 25, 72, 1, 1e-3


@pytest.fixture(scope="module")
def code2wav():
    profile = load_profile("qwen3-omni-tiny")
    path = profile.model_path(profile.models.thinker)
    if not (path / "model.safetensors").is_file():
        pytest.fail(f"{path} not built: make models PROFILE=qwen3-omni-tiny")
    return ADAPTERS.module("qwen3_omni_code2wav").load(path, ADAPTERS.params("qwen3_omni_code2wav"))


def _chunked(vocoder, codes: np.ndarray, context: int, lookahead: int) -> np.ndarray:
    out = []
    for start in range(0, len(codes), CHUNK):
        end = min(start + CHUNK, len(codes))
        left = codes[max(0, start - context) : start] if start else None
        right = codes[end : end + lookahead] if end < len(codes) else None
        out.append(vocoder.decode(codes[start:end], left, right, "ethan"))
    return np.concatenate(out)


def test_a_chunked_decode_equals_the_whole_decode(code2wav):
    codes = np.random.default_rng(0).integers(0, 2048, (FRAMES, 16))
    whole = code2wav.decode(codes, None, None, "ethan")
    assert code2wav.sample_rate == 24_000 and code2wav.samples_per_frame == 1920
    assert (FRAMES - 1) * 1920 < len(whole) <= FRAMES * 1920 and np.isfinite(whole).all()
    chunked = _chunked(code2wav, codes, CONTEXT, LOOKAHEAD)
    assert len(chunked) == len(whole)
    peak = np.abs(whole).max()
    assert peak > 0
    assert np.abs(chunked - whole).max() <= TOLERANCE * peak
    # Without context or lookahead it is not (the test can tell).
    bare = _chunked(code2wav, codes, 0, 0)
    assert len(bare) < len(whole) or np.abs(bare[: len(whole)] - whole).max() > TOLERANCE * peak
