"""Key-frame detection: a sampled frame is kept only if it differs enough from the last kept one, so
a static camera or a slide held for a minute costs the encoder one frame, not one per sample.

The difference is the mean absolute difference of 32x32 grey thumbnails (0-1): cheap, and blind to
sensor noise and compression shimmer that a pixel comparison would count. The first frame is always
kept; threshold 0 keeps every frame."""

from __future__ import annotations

import numpy as np
from PIL import Image

THUMB = 32


def thumbnail(frame: np.ndarray) -> np.ndarray:
    """uint8 RGB [h, w, 3] -> float32 grey [32, 32] in 0-1 (box-filtered: each cell a block mean)."""
    grey = Image.fromarray(np.ascontiguousarray(frame[..., :3])).convert("L")
    return np.asarray(grey.resize((THUMB, THUMB), Image.Resampling.BOX), np.float32) / 255.0


class KeyFrames:
    """Feed sampled frames in order; `offer` says whether each is kept."""

    def __init__(self, threshold: float):
        if not 0 <= threshold <= 1:
            raise ValueError("threshold is a mean absolute difference in 0-1")
        self.threshold = threshold
        self._last: np.ndarray | None = None
        self.offered = 0
        self.kept = 0

    def offer(self, frame: np.ndarray) -> bool:
        self.offered += 1
        thumb = thumbnail(frame)
        if self._last is not None and float(np.abs(thumb - self._last).mean()) < self.threshold:
            return False
        self._last = thumb
        self.kept += 1
        return True
