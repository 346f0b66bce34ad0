"""Vocoder for the `small` cascade: Piper's decoder (flow + HiFi-GAN), latent frames -> 22.05 kHz PCM.

Non-causal with a finite receptive field: a chunk decoded with the profile's `context_frames`
before it and `lookahead_frames` after it equals the same span of a whole-utterance decode
(32/32 frames: max difference ~2e-7 on this voice; 24/24: 5e-5; 16/16: 9e-3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.models import options as o
from services.models.base import VocodeInput, alike
from services.models.small import _piper

prepare = _piper.prepare


class PiperVocoder:
    def __init__(self, path: Path, options: o.PiperVocoder):
        self.meta, _config = _piper.split(path)
        self.session = _piper.session(path / self.meta.decoder, options)
        self.sample_rate = self.meta.sample_rate
        self.hop = self.meta.hop  # samples per frame
        self.version = f"piper-{_piper.VOICE}-decoder"

    def decode(
        self, units: np.ndarray, left: np.ndarray | None, right: np.ndarray | None, voice: str
    ) -> np.ndarray:
        return self.decode_batch([VocodeInput(units, left, right, voice)])[0]

    def decode_batch(self, chunks: list[VocodeInput]) -> list[np.ndarray]:
        """Chunks of one shape in one run of the decoder graph (its batch axis)."""
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(chunks)
        for group in alike(chunks):
            z_p = np.stack([
                np.concatenate([p for p in (chunks[i].left, chunks[i].units, chunks[i].right) if p is not None])
                .astype(np.float32, copy=False).T
                for i in group
            ])  # fmt: skip
            mask = np.ones((len(group), 1, z_p.shape[2]), np.float32)
            waves = self.session.run(None, {self.meta.seam.z_p: z_p, self.meta.seam.mask: mask})[0]
            left, units, _ = chunks[group[0]].shape()
            start = left * self.hop
            for row, i in enumerate(group):
                out[i] = waves[row].reshape(-1)[start : start + units * self.hop]
        return out


def load(path: Path, options: o.PiperVocoder) -> PiperVocoder:
    return PiperVocoder(path, options)
