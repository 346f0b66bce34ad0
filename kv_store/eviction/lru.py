"""Least recently used: the baseline."""

from __future__ import annotations

from collections import OrderedDict

from pydantic import BaseModel, ConfigDict

from kv_store.eviction.base import PageId, PageInfo


class LruParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Lru:
    def __init__(self, params: LruParams):
        self._order: OrderedDict[PageId, None] = OrderedDict()

    def insert(self, page: PageId, info: PageInfo) -> None:
        self._order[page] = None
        self._order.move_to_end(page)

    def touch(self, page: PageId) -> None:
        if page in self._order:
            self._order.move_to_end(page)

    def remove(self, page: PageId, evicted: bool = False) -> None:
        self._order.pop(page, None)

    def victim(self) -> PageId | None:
        return next(iter(self._order), None)

    def admit(self, candidate: PageId, victim: PageId) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._order)


PARAMS = LruParams


def create(params: LruParams) -> Lru:
    return Lru(params)
