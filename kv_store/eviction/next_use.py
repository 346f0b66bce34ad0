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

from kv_store.eviction.base import PageId
from kv_store.eviction.indexed_heap import HeapPolicy

# page -> predicted seconds until its next use (math.inf: not expected again)
Predictor = Callable[[PageId], float]


class NextUseParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NextUse(HeapPolicy):
    def __init__(self, params: NextUseParams, predict: Predictor | None = None):
        super().__init__()
        self.predict: Predictor = predict or (lambda page: math.inf)

    def _key(self, page: PageId) -> tuple[float, int]:
        # Min-heap on (-next_use, -position): furthest next use first, then suffix pages.
        return (-self.predict(page), -self._info[page].position)

    def update(self, page: PageId) -> None:
        """Its prediction changed."""
        self.touch(page)

    def update_many(self, pages: Iterable[PageId]) -> None:
        for page in pages:
            self.touch(page)


PARAMS = NextUseParams


def create(params: NextUseParams, predict: Predictor | None = None) -> NextUse:
    return NextUse(params, predict)
