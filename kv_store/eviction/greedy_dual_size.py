"""Cost-aware GreedyDual-Size: evict the page with the lowest H = L + cost / size, where L rises to
each victim's H. Expensive pages (image KV: encoder + prefill to rebuild) and small pages stay
longer; a touch restores a page's credit."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kv_store.eviction.base import PageId
from kv_store.eviction.indexed_heap import HeapPolicy


class GreedyDualSizeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GreedyDualSize(HeapPolicy):
    def __init__(self, params: GreedyDualSizeParams):
        super().__init__()
        self._inflation = 0.0  # L
        self._seq = 0  # ties: older first

    def _key(self, page: PageId) -> tuple[float, int]:
        info = self._info[page]
        self._seq += 1
        return (self._inflation + info.cost / max(info.size, 1), self._seq)

    def remove(self, page: PageId, evicted: bool = False) -> None:
        if evicted and page in self._heap:  # L rises to the victim's credit: GreedyDual's aging
            self._inflation = max(self._inflation, self._heap.key(page)[0])
        super().remove(page)


PARAMS = GreedyDualSizeParams


def create(params: GreedyDualSizeParams) -> GreedyDualSize:
    return GreedyDualSize(params)
