"""One process's view of the store: its L2 pool (and optional L3 disk tier), the shared Redis
metadata, and an eviction policy deciding what leaves L2 when room is needed.

Pages are identified by their chained hash. `put` stores and publishes a page; `get` returns it from
L2, promoting it from L3 if it was demoted; `pull` copies it from another process that provides it.
When L2 is full the policy's victim goes to L3 (if there is one) or is dropped — but only if Redis
agrees in the same atomic step (not pinned by a running request, not locked by another holder, and
not the last copy anywhere unless it is kept on this node's disk). Pinned pages are kept out of the
policy. Correctness never depends on the store: a page that is gone is recomputed by the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import numpy as np

from kv_store.disk import DiskTier
from kv_store.eviction import EvictionPolicy, PageInfo
from kv_store.metadata import KvMetadata
from kv_store.transfer import PagePool, PoolAddress

DEFAULT_INFO = PageInfo()


class StoreMetrics:
    """Prometheus metrics of a store (Ray's metrics agent exports them as ray_omniray_kv_*)."""

    def __init__(self):
        from ray.util import metrics

        self._occupancy = metrics.Gauge(
            "omniray_kv_pool_occupancy_ratio",
            description="Used share of a tier's page slots.",
            tag_keys=("tier",),
        )
        self._lookups = metrics.Counter(
            "omniray_kv_lookups_total",
            description="Page lookups by where they were found.",
            tag_keys=("result",),
        )
        self._evictions = metrics.Counter(
            "omniray_kv_evictions_total",
            description="Pages leaving L2, by policy and outcome.",
            tag_keys=("policy", "to"),
        )
        self._prefetch = metrics.Counter(
            "omniray_kv_prefetch_total",
            description="Prefetched pages by outcome (hit, done, late, skipped, cancelled).",
            tag_keys=("outcome",),
        )
        self._bytes = metrics.Counter(
            "omniray_kv_bytes_moved_total", description="Page bytes moved, by path.", tag_keys=("path",)
        )

    def occupancy(self, tier: str, ratio: float) -> None:
        self._occupancy.set(ratio, tags={"tier": tier})

    def lookup(self, result: str) -> None:
        self._lookups.inc(tags={"result": result})

    def eviction(self, policy: str, to: str) -> None:
        self._evictions.inc(tags={"policy": policy, "to": to})

    def prefetch(self, outcome: str) -> None:
        self._prefetch.inc(tags={"outcome": outcome})

    def moved(self, path: str, n_bytes: int) -> None:
        self._bytes.inc(n_bytes, tags={"path": path})


class KvStore:
    def __init__(
        self,
        provider: str,
        pool: PagePool,
        meta: KvMetadata,
        policy: EvictionPolicy,
        disk: DiskTier | None = None,
        metrics: StoreMetrics | None = None,
    ):
        self.provider, self.pool, self.meta, self.policy, self.disk = provider, pool, meta, policy, disk
        self.metrics = metrics
        self.policy_name = type(policy).__name__
        self._info: dict[Hashable, PageInfo] = {}
        self._pins: dict[Hashable, int] = {}

    def _observe(self) -> None:
        if self.metrics:
            self.metrics.occupancy("L2", self.pool.used / self.pool.capacity)
            if self.disk:
                self.metrics.occupancy("L3", self.disk.used / self.disk.capacity)

    async def _make_room(self) -> None:
        """Evict from L2 until a slot is free; MemoryError when nothing may leave."""
        refused: list[Hashable] = []
        try:
            while self.pool.full:
                victim = self.policy.victim()
                if victim is None:
                    raise MemoryError(f"L2 pool {self.pool.name} is full of pages that may not leave")
                to = "L3" if self.disk is not None else ""
                # Without a lower tier the last copy may go: the caller recomputes what is missing.
                outcome = await self.meta.evict(victim, self.provider, allow_last=not to, to_tier=to)
                if outcome != "ok":  # in use elsewhere or locked: try the next candidate
                    self.policy.remove(victim)
                    refused.append(victim)
                    continue
                self.policy.remove(victim, evicted=True)
                if self.disk is not None:
                    await self.disk.demote(victim)
                    self._moved("L2->L3")
                else:
                    self.pool.free(victim)
                if self.metrics:
                    self.metrics.eviction(self.policy_name, to or "dropped")
        finally:
            for page in refused:  # still resident: back into the order
                self.policy.insert(page, self._info[page])
            self._observe()

    async def _publish_l2(self, page: Hashable) -> None:
        tier = f"L2@{self.pool.slot_of(page)}"
        await self.meta.publish(self.provider, tier, self.pool.layout.page_bytes, [page])

    def _moved(self, path: str) -> None:
        if self.metrics:
            self.metrics.moved(path, self.pool.layout.page_bytes)

    async def put(self, page: Hashable, data: np.ndarray, info: PageInfo = DEFAULT_INFO) -> None:
        if self.pool.slot_of(page) is None:
            await self._make_room()
            self.pool.put(page, data)
            self._info[page] = info
            self.policy.insert(page, info)
        await self._publish_l2(page)
        self._observe()

    async def get(self, page: Hashable) -> np.ndarray | None:
        if (data := self.pool.get(page)) is not None:
            self.policy.touch(page)
            self._lookup("L2")
            return data
        if self.disk is not None and page in self.disk:
            await self._make_room()
            await self.disk.promote(page)
            self.policy.insert(page, self._info.get(page, DEFAULT_INFO))
            await self._publish_l2(page)
            self._moved("L3->L2")
            self._lookup("L3")
            self._observe()
            return self.pool.get(page)
        self._lookup("miss")
        return None

    async def pull(
        self, peer: PoolAddress, page: Hashable, peer_slot: int, info: PageInfo = DEFAULT_INFO
    ) -> np.ndarray:
        """Copy a page another process provides into this pool (and provide it from here too)."""
        if self.pool.slot_of(page) is None:
            await self._make_room()
            await self.pool.pull(peer, [(page, peer_slot)])
            self._info[page] = info
            self.policy.insert(page, info)
            self._moved("peer->L2")
        await self._publish_l2(page)
        self._observe()
        return self.pool.get(page)

    async def advertise(self) -> None:
        await self.meta.advertise(self.provider, self.pool.address())

    def prefetch(self, pages: list[Hashable]) -> Prefetch:
        """Start bringing `pages` into L2 (from L3 here, or from a peer's L2) in the background."""
        return Prefetch(self, pages)

    async def _fetch_one(self, page: Hashable) -> str:
        if self.pool.slot_of(page) is not None:
            return "hit"
        if self.disk is not None and page in self.disk:
            await self.get(page)
            return "done"
        providers = await self.meta.providers(page)
        for provider in providers.holders:
            slot = providers.slot(provider)
            if provider == self.provider or providers.tier(provider) != "L2" or slot is None:
                continue
            if (address := await self.meta.address(provider)) is not None:
                await self.pull(address, page, slot)
                return "done"
        return "skipped"

    async def pin(self, request_id: str, pages: list[Hashable]) -> bool:
        """A running request uses these pages: they may not be evicted anywhere until unpinned."""
        if not await self.meta.pin(request_id, pages):
            return False
        for page in pages:
            self._pins[page] = self._pins.get(page, 0) + 1
            self.policy.remove(page)
        return True

    async def unpin(self, request_id: str, pages: list[Hashable]) -> None:
        await self.meta.unpin(request_id, pages)
        for page in pages:
            self._pins[page] -= 1
            if not self._pins[page]:
                del self._pins[page]
                if self.pool.slot_of(page) is not None:
                    self.policy.insert(page, self._info.get(page, DEFAULT_INFO))

    def _lookup(self, result: str) -> None:
        if self.metrics:
            self.metrics.lookup(result)


class Prefetch:
    """A background fetch of pages into L2. Outcomes per page: `hit` (already here), `done`,
    `skipped` (no provider holds it in L2: the caller recomputes), `cancelled`; a consumer that has to
    wait for it marks it `late`. Cancelling is safe at any point: a page is either fully here or not."""

    def __init__(self, store: KvStore, pages: list[Hashable]):
        self.store, self.pages = store, list(pages)
        self.outcomes: dict[Hashable, str] = {}
        self.late = False
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        for page in self.pages:
            self.outcomes[page] = "cancelled"  # until it finishes
            self.outcomes[page] = await self.store._fetch_one(page)

    def cancel(self) -> None:
        self._task.cancel()

    @property
    def done(self) -> bool:
        return self._task.done()

    async def wait(self) -> dict[Hashable, str]:
        """The consumer needs the pages now (the synchronous path when the prefetch is not done)."""
        self.late = not self._task.done()
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise
        for page in self.pages:
            self.outcomes.setdefault(page, "cancelled")
        if self.store.metrics:
            for outcome in self.outcomes.values():
                self.store.metrics.prefetch("late" if self.late and outcome == "done" else outcome)
        return dict(self.outcomes)
