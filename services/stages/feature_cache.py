"""Encoder feature cache (host memory, per encoder replica): the same image, encoded by the same
encoder under the same tile policy for the same tenant, is not encoded twice.

Keys are sha256 over tenant, image content hash, encoder version and tile grid/policy version, so a
new encoder or tile policy never hits old entries and one tenant never reads another's features.
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


class FeatureCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, EncoderOutput] = OrderedDict()

    def get(self, key: str) -> EncoderOutput | None:
        out = self._items.get(key)
        if out is not None:
            self._items.move_to_end(key)
        return out

    def put(self, key: str, out: EncoderOutput) -> None:
        size = _size(out)
        if size > self.max_bytes:
            return
        if (old := self._items.pop(key, None)) is not None:
            self.bytes -= _size(old)
        self._items[key] = out
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self.bytes -= _size(evicted)

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)
