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
        import torch

        left = np.zeros((0, self.codebooks), np.int64) if left is None else left
        right = np.zeros((0, self.codebooks), np.int64) if right is None else right
        codes = torch.from_numpy(np.concatenate([left, units, right]).astype(np.int64).T[None]).to(
            next(self.model.parameters()).device
        )
        with torch.inference_mode():
            wav = self.model(codes)[0, 0]
        start = len(left) * self.samples_per_frame
        end = start + len(units) * self.samples_per_frame if len(right) else None
        return wav[start:end].float().cpu().numpy()


def verify(path: Path, options: o.Qwen3OmniCode2Wav) -> None:
    checkpoint.verify(path, "code2wav_config")


def prepare(dest: Path, options: o.Qwen3OmniCode2Wav) -> None:
    checkpoint.prepare(dest)


def load(path: Path, options: o.Qwen3OmniCode2Wav) -> Code2Wav:
    return Code2Wav(path)
