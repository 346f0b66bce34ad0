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


def test_chunks_of_several_streams_in_one_forward_equal_each_alone(code2wav):
    """The vocoder stage's batches (services/stages/urgency_batcher.py): chunks of five streams, of
    two shapes (first chunks, steady chunks with their context) and a last one without lookahead,
    decode in one call to what each decodes alone (float rounding of the batched kernels aside)."""
    from services.models.base import VocodeInput, alike

    rng = np.random.default_rng(1)

    def codes(n):
        return rng.integers(0, 2048, (n, 16))

    chunks = [
        VocodeInput(codes(3), None, codes(1)),
        VocodeInput(codes(3), None, codes(1)),
        VocodeInput(codes(CHUNK), codes(CONTEXT), codes(1)),
        VocodeInput(codes(CHUNK), codes(CONTEXT), codes(1)),
        VocodeInput(codes(7), codes(CONTEXT), None),
    ]
    assert [len(g) for g in alike(chunks)] == [2, 2, 1]
    batched = code2wav.decode_batch(chunks)
    for chunk, got in zip(chunks, batched, strict=True):
        alone = code2wav.decode(chunk.units, chunk.left, chunk.right, "ethan")
        assert got.shape == alone.shape
        np.testing.assert_allclose(got, alone, rtol=0, atol=1e-5 * np.abs(alone).max())


def test_the_convolutions_need_only_a_few_frames_of_the_context(code2wav, monkeypatch):
    """The chunk's samples when only the pre-transformer reads all 72 frames of context and the
    convolutions after it CONV_CONTEXT of them equal transformers' whole forward over the chunk with
    its context, to float rounding — and with too little (2 frames) they do not."""
    import torch

    from services.models.qwen3_omni import code2wav as module

    rng = np.random.default_rng(2)
    left, units, right = (rng.integers(0, 2048, (n, 16)) for n in (CONTEXT, CHUNK, 1))
    with torch.inference_mode():
        whole = code2wav.model(torch.from_numpy(np.concatenate([left, units, right]).T[None]))[0, 0].numpy()
    expected = whole[CONTEXT * 1920 : (CONTEXT + CHUNK) * 1920]
    peak = np.abs(expected).max()
    got = code2wav.decode(units, left, right, "ethan")
    assert module.CONV_CONTEXT < CONTEXT
    assert np.abs(got - expected).max() <= 1e-5 * peak
    monkeypatch.setattr(module, "CONV_CONTEXT", 2)
    assert np.abs(code2wav.decode(units, left, right, "ethan") - expected).max() > 1e-3 * peak


def test_the_compiled_forward_decodes_what_the_eager_one_does():
    """The GPU profile's `compile` (static shapes: batch buckets, a graph per chunk shape), traced here
    with torch.compile's aot_eager backend: the same samples as eager for a batch padded to its bucket."""
    from services.models.base import VocodeInput
    from services.models.qwen3_omni.code2wav import Code2Wav

    profile = load_profile("qwen3-omni-tiny")
    path = profile.model_path(profile.models.thinker)
    eager, traced = Code2Wav(path), Code2Wav(path, "aot_eager")
    rng = np.random.default_rng(3)
    chunks = [VocodeInput(rng.integers(0, 2048, (CHUNK, 16)), rng.integers(0, 2048, (CONTEXT, 16)),
                          rng.integers(0, 2048, (1, 16))) for _ in range(3)]  # fmt: skip
    for got, want in zip(traced.decode_batch(chunks), eager.decode_batch(chunks), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
