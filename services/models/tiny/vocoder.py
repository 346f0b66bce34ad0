"""Tiny conv vocoder: speech units -> 24 kHz PCM, 20 ms per unit.

Causal convolutions at unit rate then non-overlapping transposed convolutions, so a chunk decoded
with CONTEXT_UNITS of left context equals the same span of a whole-utterance decode exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from services.models import options as o
from services.models.base import VocodeInput, alike
from services.models.tiny import _weights
from services.models.tiny.talker import N_UNITS

SAMPLE_RATE = 24000
SAMPLES_PER_UNIT = 480  # 8 * 6 * 10
KERNEL = 3
N_CAUSAL = 2
CONTEXT_UNITS = N_CAUSAL * (KERNEL - 1)  # causal: no lookahead needed


class TinyConvVocoder(nn.Module):
    def __init__(self, width: int, n_units: int):
        super().__init__()
        self.emb = nn.Embedding(n_units, width)
        self.causal = nn.ModuleList([nn.Conv1d(width, width, KERNEL) for _ in range(N_CAUSAL)])
        self.up = nn.ModuleList(
            [
                nn.ConvTranspose1d(width, 32, 8, stride=8),
                nn.ConvTranspose1d(32, 16, 6, stride=6),
                nn.ConvTranspose1d(16, 1, 10, stride=10),
            ]
        )

    def forward(self, units: torch.Tensor) -> torch.Tensor:  # [1, n] -> [1, n * 480]
        x = self.emb(units).transpose(1, 2)
        for conv in self.causal:
            x = F.gelu(conv(F.pad(x, (KERNEL - 1, 0))))
        for i, up in enumerate(self.up):
            x = up(x)
            if i < len(self.up) - 1:
                x = F.gelu(x)
        return torch.tanh(x)[:, 0]


def prepare(dest: Path, options: o.TinyVocoder) -> None:
    torch.manual_seed(options.seed)
    arch = {"width": 64, "n_units": N_UNITS}
    _weights.save(TinyConvVocoder(**arch), dest, {"arch": arch, "version": "tiny-vocoder-1"})


class TinyVocoder:
    sample_rate = SAMPLE_RATE

    def __init__(self, path: Path):
        self.model, config = _weights.load(TinyConvVocoder, path)
        self.version = config["version"]

    def decode(
        self, units: np.ndarray, left: np.ndarray | None, right: np.ndarray | None, voice: str
    ) -> np.ndarray:
        return self.decode_batch([VocodeInput(units, left, right, voice)])[0]

    @torch.inference_mode()
    def decode_batch(self, chunks: list[VocodeInput]) -> list[np.ndarray]:
        """Chunks of one shape in one forward (the context each keeps: its last CONTEXT_UNITS)."""
        trimmed = [
            VocodeInput(
                c.units, np.zeros(0, np.int32) if c.left is None else c.left[-CONTEXT_UNITS:], None, c.voice
            )
            for c in chunks
        ]
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(chunks)
        for group in alike(trimmed):
            x = torch.from_numpy(
                np.stack([np.concatenate([trimmed[i].left, trimmed[i].units]) for i in group]).astype(
                    np.int64
                )
            )
            waves = self.model(x)[:, len(trimmed[group[0]].left) * SAMPLES_PER_UNIT :].numpy()
            for row, i in enumerate(group):
                out[i] = waves[row]
        return out


def load(path: Path, options: o.TinyVocoder) -> TinyVocoder:
    return TinyVocoder(path)
