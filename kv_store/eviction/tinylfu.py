"""Frequency-aware admission (TinyLFU): a new page only displaces the LRU victim when it has been
asked for more often recently. Frequencies live in a count-min sketch that halves every
`sample_size` increments, so old popularity fades; eviction order among resident pages is LRU."""

from __future__ import annotations

import hashlib

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kv_store.eviction.base import PageId, PageInfo
from kv_store.eviction.lru import Lru, LruParams


class TinyLfuParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int = Field(default=4096, ge=16)  # counters per row
    depth: int = Field(default=4, ge=1, le=8)
    sample_size: int = Field(default=40_960, ge=1)  # increments between halvings


class TinyLfu:
    def __init__(self, params: TinyLfuParams):
        self.params = params
        self._lru = Lru(LruParams())
        self._sketch = np.zeros((params.depth, params.width), np.uint32)
        self._increments = 0

    def _slots(self, page: PageId) -> np.ndarray:
        digest = hashlib.blake2b(repr(page).encode(), digest_size=4 * self.params.depth).digest()
        return np.frombuffer(digest, np.uint32) % self.params.width

    def record(self, page: PageId) -> None:
        """Count an access (hit or miss): what admission compares."""
        rows = np.arange(self.params.depth)
        self._sketch[rows, self._slots(page)] += 1
        self._increments += 1
        if self._increments >= self.params.sample_size:
            self._sketch >>= 1
            self._increments //= 2

    def frequency(self, page: PageId) -> int:
        return int(self._sketch[np.arange(self.params.depth), self._slots(page)].min())

    def insert(self, page: PageId, info: PageInfo) -> None:
        self._lru.insert(page, info)

    def touch(self, page: PageId) -> None:
        self.record(page)
        self._lru.touch(page)

    def remove(self, page: PageId, evicted: bool = False) -> None:
        self._lru.remove(page)

    def victim(self) -> PageId | None:
        return self._lru.victim()

    def admit(self, candidate: PageId, victim: PageId) -> bool:
        return self.frequency(candidate) > self.frequency(victim)

    def __len__(self) -> int:
        return len(self._lru)


PARAMS = TinyLfuParams


def create(params: TinyLfuParams) -> TinyLfu:
    return TinyLfu(params)
