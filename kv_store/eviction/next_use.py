"""Next-use-aware eviction (after LiveServe): evict the page whose predicted next use is furthest in
the future; among equals, suffix pages (higher chain position) before prefix pages, which other turns
and sessions are likelier to share. Predictions come from a callback — the realtime issue wires it to
the session monitor (remaining playback + reply-gap estimate); pages of a session that started
speaking predict "now". An indexed heap keeps every decision O(log n): no scans.

The store calls `update(page)` (or `update_many`) when a page's prediction changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from pydantic import BaseModel, ConfigDict

from kv_store.eviction.base import PageId, PageInfo
from kv_store.eviction.indexed_heap import IndexedHeap

# page -> predicted seconds until its next use (math.inf: not expected again)
Predictor = Callable[[PageId], float]


class NextUseParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NextUse:
    def __init__(self, params: NextUseParams, predict: Predictor | None = None):
        self.predict: Predictor = predict or (lambda page: math.inf)
        self._heap = IndexedHeap()  # min-heap on (-next_use, -position): furthest, then suffix, first
        self._info: dict[PageId, PageInfo] = {}

    def _key(self, page: PageId) -> tuple[float, int]:
        return (-self.predict(page), -self._info[page].position)

    def insert(self, page: PageId, info: PageInfo) -> None:
        self._info[page] = info
        self._heap.push(page, self._key(page))

    def update(self, page: PageId) -> None:
        """Its prediction changed."""
        if page in self._heap:
            self._heap.push(page, self._key(page))

    def update_many(self, pages: Iterable[PageId]) -> None:
        for page in pages:
            self.update(page)

    touch = update

    def remove(self, page: PageId, evicted: bool = False) -> None:
        self._heap.remove(page)
        self._info.pop(page, None)

    def victim(self) -> PageId | None:
        return self._heap.peek()

    def admit(self, candidate: PageId, victim: PageId) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._heap)


def create(params: dict, predict: Predictor | None = None) -> NextUse:
    return NextUse(NextUseParams.model_validate(params), predict)
