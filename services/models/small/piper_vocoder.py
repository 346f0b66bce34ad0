"""Vocoder for the `small` cascade: Piper's decoder (flow + HiFi-GAN), latent frames -> 22.05 kHz PCM.

Non-causal with a finite receptive field: a chunk decoded with the profile's `context_frames`
before it and `lookahead_frames` after it equals the same span of a whole-utterance decode
(32/32 frames: max difference ~2e-7 on this voice; 24/24: 5e-5; 16/16: 9e-3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.models import options as o
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
        parts = [p for p in (left, units, right) if p is not None]
        frames = np.concatenate(parts).astype(np.float32, copy=False)  # [T, channels]
        z_p = np.ascontiguousarray(frames.T)[None]
        mask = np.ones((1, 1, z_p.shape[2]), np.float32)
        wave = self.session.run(None, {self.meta.seam.z_p: z_p, self.meta.seam.mask: mask})[0].reshape(-1)
        start = (0 if left is None else len(left)) * self.hop
        return wave[start : start + len(units) * self.hop]


def load(path: Path, options: o.PiperVocoder) -> PiperVocoder:
    return PiperVocoder(path, options)
