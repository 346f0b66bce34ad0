"""Cost-aware GreedyDual-Size: evict the page with the lowest H = L + cost / size, where L rises to
each victim's H. Expensive pages (image KV: encoder + prefill to rebuild) and small pages stay
longer; a touch restores a page's credit."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kv_store.eviction.base import PageId, PageInfo
from kv_store.eviction.indexed_heap import IndexedHeap


class GreedyDualSizeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GreedyDualSize:
    def __init__(self, params: GreedyDualSizeParams):
        self._heap = IndexedHeap()
        self._info: dict[PageId, PageInfo] = {}
        self._inflation = 0.0  # L
        self._seq = 0  # ties: older first

    def _credit(self, page: PageId) -> tuple[float, int]:
        info = self._info[page]
        self._seq += 1
        return (self._inflation + info.cost / max(info.size, 1), self._seq)

    def insert(self, page: PageId, info: PageInfo) -> None:
        self._info[page] = info
        self._heap.push(page, self._credit(page))

    def touch(self, page: PageId) -> None:
        if page in self._heap:
            self._heap.push(page, self._credit(page))

    def remove(self, page: PageId, evicted: bool = False) -> None:
        if page in self._heap:
            if evicted:  # L rises to the victim's credit: the "aging" of GreedyDual
                self._inflation = max(self._inflation, self._heap.key(page)[0])
            self._heap.remove(page)
        self._info.pop(page, None)

    def victim(self) -> PageId | None:
        return self._heap.peek()

    def admit(self, candidate: PageId, victim: PageId) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._heap)


def create(params: dict) -> GreedyDualSize:
    return GreedyDualSize(GreedyDualSizeParams.model_validate(params))
