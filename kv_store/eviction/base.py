"""What every eviction policy implements. A policy orders the pages that may be evicted; the store
keeps pinned pages (in use by a running request) out of it: `remove` on pin, `insert` on unpin."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

PageId = Hashable


@dataclass(frozen=True)
class PageInfo:
    size: int = 1  # bytes (or any unit; cost-aware policies divide by it)
    cost: float = 1.0  # cost to recompute (e.g. prefill seconds; image KV costs more)
    position: int = 0  # index in its session/prefix chain (suffix pages have higher positions)


class EvictionPolicy(Protocol):
    def insert(self, page: PageId, info: PageInfo) -> None:
        """A page became evictable (new, or unpinned)."""

    def touch(self, page: PageId) -> None:
        """The page was read (a hit)."""

    def remove(self, page: PageId, evicted: bool = False) -> None:
        """The page left the policy: `evicted` (the store chose it), or pinned / deleted.
        Unknown pages are ignored."""

    def victim(self) -> PageId | None:
        """The page to evict next, without removing it; None when empty."""

    def admit(self, candidate: PageId, victim: PageId) -> bool:
        """Whether a new page is worth evicting `victim` for (admission filters); default yes."""

    def __len__(self) -> int: ...
