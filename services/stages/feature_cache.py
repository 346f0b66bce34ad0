"""Encoder feature cache (host memory, per encoder replica): the same image, encoded by the same
encoder under the same tile policy for the same tenant, is not encoded twice.

Keys are sha256 over tenant, image content hash, encoder version and tile grid/policy version, so a
new encoder or tile policy never hits old entries and one tenant never reads another's features.
A video is cached tile by tile, each tile named by its key frames' pixels: a clip sent again, or a
camera showing the same scene in the next turn, is not encoded twice.
Bounded by bytes, least recently used out first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from services.models.base import EncoderOutput


def cache_key(tenant: str, content_hash: str, encoder_version: str, grid: str) -> str:
    return hashlib.sha256("\0".join((tenant, content_hash, encoder_version, grid)).encode()).hexdigest()


def _size(out: EncoderOutput) -> int:
    return (out.embeddings.nbytes if out.embeddings is not None else 0) + len(out.text or "")


FRAME = "frame"  # the grid part of a video tile's key: a tile of key frames, named by their pixels


class FeatureCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        # key -> (an image's or clip's EncoderOutput, or a video tile's features; its bytes)
        self._items: OrderedDict[str, tuple[object, int]] = OrderedDict()

    def get(self, key: str):
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        return hit[0]

    def put(self, key: str, out, size: int | None = None) -> None:
        """`size`: the bytes of what is not an EncoderOutput (a video tile's features)."""
        size = _size(out) if size is None else size
        if size > self.max_bytes:
            return
        if (old := self._items.pop(key, None)) is not None:
            self.bytes -= old[1]
        self._items[key] = (out, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, evicted) = self._items.popitem(last=False)
            self.bytes -= evicted

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)
