"""Model adapter interfaces: what each stage needs from a model, whatever the profile.

A profile names an adapter per role (thinker, vision, audio, talker, vocoder); the stage code only
speaks these interfaces, so a new profile is a YAML plus adapters, never new plumbing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class EncoderOutput:
    """What the thinker receives for one media item: embeddings (native path) or text (cascade)."""

    embeddings: np.ndarray | None = None  # [n_tokens, thinker_hidden] float32
    text: str | None = None
    tiles: int = 0
    audio_seconds: float = 0.0


class VisionEncoder(Protocol):
    """Tile-level: the encoder pool cuts images into tiles (the router's grid), batches tiles of
    many requests through `encode_tiles`, and reassembles each image with `assemble`."""

    version: str

    def preprocess(self, tile) -> np.ndarray:
        """One RGB PIL tile (or the whole image for a 1x1 grid) -> the model's input array."""

    def encode_tiles(self, tiles: np.ndarray) -> np.ndarray:
        """[B, ...] preprocessed tiles from any requests -> [B, ...] per-tile features."""

    def assemble(self, features: np.ndarray) -> EncoderOutput:
        """One image's tile features, in row-major grid order -> what the thinker sees."""


class AudioEncoder(Protocol):
    version: str
    sample_rate: int

    def encode(self, waves: list[np.ndarray]) -> list[EncoderOutput]:
        """Mono float32 waves at `sample_rate` -> one output per wave."""


class Talker(Protocol):
    version: str

    def stream_units(self, text: str, voice: str) -> Iterator[np.ndarray]:
        """Text -> speech units (int32 [n]) or latent frames (float32 [n, d]), chunk by chunk."""


class Vocoder(Protocol):
    version: str
    sample_rate: int

    def decode(
        self, units: np.ndarray, left: np.ndarray | None, right: np.ndarray | None, voice: str
    ) -> np.ndarray:
        """Units -> float32 mono PCM in [-1, 1] for `units` only; `left`/`right` are context that is
        decoded but not emitted (how much a chunk needs is the profile's VocoderSpec)."""
