"""Qwen3-Omni's code2wav as the vocoder stage: 16-codebook codec frames (12.5 per second) to 24 kHz
PCM, decoded in chunks as the talker writes them.

The stage hands each chunk its neighbours (`left` / `right`, as many frames as the profile's
`context_frames` / `lookahead_frames`): the chunk is decoded with them and only its own samples
(1920 per frame) are kept. The decoder's last ~555 samples of any input depend on frames after it, so
one frame of lookahead makes the chunk's samples whole; left context bounds the difference to a
whole-utterance decode, since the pre-transformer's sliding window (72 frames a layer) sees further
back than any practical context. Measured on `qwen3-omni-tiny` (tests/contracts/test_qwen3_omni_code2wav.py):
72 frames of context, 1 of lookahead: within 1e-3 of the whole decode's peak.

Weights: the `code2wav.` tensors of the model's checkpoint (the thinker's directory), loaded alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.models import options as o
from services.models.base import VocodeInput, alike
from services.models.qwen3_omni import checkpoint

SAMPLE_RATE = 24_000


class Code2Wav:
    sample_rate = SAMPLE_RATE

    def __init__(self, path: Path):
        from transformers import AutoConfig
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

        config = AutoConfig.from_pretrained(path).code2wav_config
        self.model = checkpoint.module(Qwen3OmniMoeCode2Wav, config, path, "code2wav.")
        self.samples_per_frame = int(self.model.total_upsample)
        self.codebooks = config.num_quantizers
        self.version = f"qwen3-omni-code2wav:{path.name}"

    def decode(
        self, units: np.ndarray, left: np.ndarray | None, right: np.ndarray | None, voice: str
    ) -> np.ndarray:
        """`units`: [frames, 16] codes; returns their float32 PCM (the last chunk of an utterance,
        with no `right`, is a little shorter: the decoder trims its tail)."""
        return self.decode_batch([VocodeInput(units, left, right, voice)])[0]

    def decode_batch(self, chunks: list[VocodeInput]) -> list[np.ndarray]:
        """Chunks of one shape (their context and length) in one forward, [chunks, 16, frames]."""
        import torch

        device = next(self.model.parameters()).device
        empty = np.zeros((0, self.codebooks), np.int64)
        out: list[np.ndarray] = [empty] * len(chunks)
        for group in alike(chunks):
            codes = np.stack([
                np.concatenate([chunks[i].left if chunks[i].left is not None else empty, chunks[i].units,
                                chunks[i].right if chunks[i].right is not None else empty]).astype(np.int64).T
                for i in group
            ])  # fmt: skip
            with torch.inference_mode():
                wavs = self.model(torch.from_numpy(codes).to(device))[:, 0].float().cpu().numpy()
            left, units, right = chunks[group[0]].shape()
            start = left * self.samples_per_frame
            end = start + units * self.samples_per_frame if right else None
            for row, i in enumerate(group):
                out[i] = wavs[row, start:end]
        return out


def verify(path: Path, options: o.Qwen3OmniCode2Wav) -> None:
    checkpoint.verify(path, "code2wav_config")


def prepare(dest: Path, options: o.Qwen3OmniCode2Wav) -> None:
    checkpoint.prepare(dest)


def load(path: Path, options: o.Qwen3OmniCode2Wav) -> Code2Wav:
    return Code2Wav(path)
