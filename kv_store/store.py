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
import logging
import time
from collections.abc import Hashable

import numpy as np

from kv_store.disk import DiskTier
from kv_store.eviction import EvictionPolicy, PageInfo
from kv_store.metadata import KvMetadata
from kv_store.metrics import Metrics
from kv_store.transfer import PagePool, PoolAddress, TransferError

DEFAULT_INFO = PageInfo()
log = logging.getLogger(__name__)


class KvStore:
    def __init__(
        self,
        provider: str,
        pool: PagePool,
        meta: KvMetadata,
        policy: EvictionPolicy,
        disk: DiskTier | None = None,
        metrics: Metrics | None = None,
    ):
        self.provider, self.pool, self.meta, self.policy, self.disk = provider, pool, meta, policy, disk
        self.metrics = metrics
        self.policy_name = type(policy).__name__
        if metrics:  # the eviction series exist (at 0) before the pool first fills
            for to in (["L3"] if disk else []) + ["dropped"]:
                metrics.eviction(self.policy_name, to, 0)
        self._info: dict[Hashable, PageInfo] = {}
        self._pins: dict[Hashable, int] = {}
        self._bandwidth: float | None = None  # bytes/s of peer pulls (moving average)
        # Reserved pages whose bytes are still being written (reserve -> commit/abandon): readers wait.
        self._writing: dict[Hashable, asyncio.Future] = {}

    def _observe(self) -> None:
        if self.metrics:
            self.metrics.occupancy("L2", self.pool.used / self.pool.capacity)
            if self.disk:
                self.metrics.occupancy("L3", self.disk.used / self.disk.capacity)

    async def _make_room(self, n: int = 1) -> None:
        """Evict from L2 until `n` slots are free; MemoryError when nothing more may leave."""
        refused: list[Hashable] = []
        try:
            while self.pool.free_slots < n:
                victim = self.policy.victim()
                if victim is None:
                    raise MemoryError(f"L2 pool {self.pool.name} is full of pages that may not leave")
                to = "L3" if self.disk is not None else ""
                # Without a lower tier the last copy may go: the caller recomputes what is missing.
                outcome = await self.meta.evict(victim, self.provider, allow_last=not to, to_tier=to)
                if outcome == "absent":  # Redis forgot this copy (we were declared dead): just free it
                    to = ""
                elif outcome != "ok":  # in use elsewhere or locked: try the next candidate
                    self.policy.remove(victim)
                    refused.append(victim)
                    continue
                self.policy.remove(victim, evicted=True)
                if to:
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

    def _moved(self, path: str) -> None:
        if self.metrics:
            self.metrics.moved(path, self.pool.layout.page_bytes)

    async def put(self, page: Hashable, data: np.ndarray, info: PageInfo = DEFAULT_INFO) -> None:
        if self.pool.slot_of(page) is None:
            await self._make_room()
            self.pool.put(page, data)
        await self.commit([page], info)

    async def get(self, page: Hashable) -> np.ndarray | None:
        if (data := self.pool.get(page)) is not None:
            self.policy.touch(page)
            self._lookup("L2")
            return data
        if self.disk is not None and page in self.disk:
            await self._make_room()
            await self.disk.promote(page)
            await self.commit([page], self._info.get(page, DEFAULT_INFO))
            self._moved("L3->L2")
            self._lookup("L3")
            return self.pool.get(page)
        self._lookup("miss")
        return None

    async def _pull(self, peer: PoolAddress, pages: list[tuple[Hashable, int]]) -> None:
        """Copy pages ((page, slot in the peer's pool)) from another process into this pool in one
        transfer, and provide them from here too."""
        await self._make_room(len(pages))
        started = time.perf_counter()
        await self.pool.pull(peer, pages)
        seconds = time.perf_counter() - started
        rate = len(pages) * self.pool.layout.page_bytes / max(seconds, 1e-6)
        self._bandwidth = rate if self._bandwidth is None else 0.8 * self._bandwidth + 0.2 * rate
        if self.metrics:
            self.metrics.transfer("peer->L2", seconds)
            self.metrics.moved("peer->L2", len(pages) * self.pool.layout.page_bytes)
        await self.commit([p for p, _ in pages])

    def here(self, page: Hashable) -> bool:
        """In L2 and readable now (not still arriving)."""
        return self.pool.slot_of(page) is not None and not self.pool.arriving(page)

    def evictable(self, page: Hashable) -> bool:
        """In L2 and in the eviction order (not pinned or held)."""
        return self.pool.slot_of(page) is not None and page not in self._pins

    def measured_bandwidth(self) -> float | None:
        """Bytes per second of recent peer pulls (moving average), None before the first."""
        return self._bandwidth

    def record_prefetch(self, outcome: str, n: int = 1) -> None:
        if self.metrics:
            self.metrics.prefetch(outcome, n)

    async def advertise(self) -> None:
        await self.meta.advertise(self.provider, self.pool.address())

    async def prefetch(self, target: str | list[Hashable]) -> Prefetch:
        """Start bringing a session's pages (`target` a session id: its chain in Redis) or a prefix
        (a list of page hashes) into L2, from L3 here or a peer's L2, in the background."""
        pages = await self.meta.chain(target) if isinstance(target, str) else target
        return Prefetch(self, pages)

    async def _bring(self, pages: list[Hashable], hold: bool = False) -> dict[Hashable, str]:
        """Bring pages into L2: per page 'hit' (here), 'L3' (promoted), 'peer' (pulled; one transfer
        per providing process), 'skipped' (no copy anywhere) or 'failed' (copies are listed but none
        could be read). With `hold`, each page is kept out of the eviction order as soon as it is
        here (until `release`), so bringing later pages cannot evict earlier ones."""
        outcomes: dict[Hashable, str] = {}
        remote: list[Hashable] = []
        for page in pages:
            if page in self._writing:  # a save is filling its slot right now
                await asyncio.shield(self._writing[page])
        for page in pages:
            if self.pool.slot_of(page) is not None and not self.pool.arriving(page):
                outcomes[page] = "hit"
                if page not in self._pins:
                    self.policy.touch(page)
            elif self.disk is not None and page in self.disk:
                await self.get(page)
                outcomes[page] = "L3"
            else:
                remote.append(page)
                continue
            if hold:
                self._hold(page)
        listed = dict(zip(remote, await self.meta.providers_of(remote), strict=True))
        dead: set[str] = set()
        while remote:
            groups: dict[str, list[tuple[Hashable, int]]] = {}
            for page in remote:
                providers = listed[page]
                for provider in providers.holders:
                    slot = providers.slot(provider)
                    if provider not in dead and provider != self.provider and slot is not None:
                        groups.setdefault(provider, []).append((page, slot))
                        break
                else:
                    outcomes[page] = "failed" if any(p in dead for p in providers.holders) else "skipped"
            if not groups:
                break
            for provider, group in groups.items():
                address = await self.meta.address(provider)
                try:
                    if address is None:
                        raise TransferError(f"{provider} has no address")
                    await self._pull(address, group)
                except TransferError as e:
                    # Unreachable: declared dead, so no one matches its pages again (if it was only
                    # slow, its heartbeat revives it and its new pages are found; the old ones are
                    # recomputed — a miss, never a wrong answer).
                    log.warning("%d pages from %s: %s; dropping its pages", len(group), provider, e)
                    dead.add(provider)
                    await self.meta.declare_dead(provider)
                    continue
                for page, _ in group:
                    outcomes[page] = "peer"
                    if hold:
                        self._hold(page)
            remote = [p for p in remote if p not in outcomes]
        return outcomes

    async def fetch(self, pages: list[Hashable]) -> dict[Hashable, np.ndarray | None]:
        """Bring `pages` into L2 and hold them there (out of the eviction order) until `release`;
        a page that cannot be had maps to None (the caller recomputes it)."""
        outcomes = await self._bring(pages, hold=True)
        for outcome in outcomes.values():
            if outcome != "L3":  # get() counted that one
                self._lookup({"hit": "L2", "skipped": "miss"}.get(outcome, outcome))
        return {p: self.pool.get(p) if outcomes[p] in ("hit", "L3", "peer") else None for p in pages}

    async def reserve(self, pages: list[Hashable]) -> dict[Hashable, np.ndarray]:
        """Slots for new pages the caller is about to write (pages already here, or listed twice, are
        left out); `commit` publishes them, `abandon` gives them back. Until then they are out of the
        eviction order and readers wait for them."""
        out = {}
        loop = asyncio.get_running_loop()
        try:
            for page in dict.fromkeys(pages):
                if self.pool.slot_of(page) is None:
                    await self._make_room()
                    out[page] = self.pool.page(self.pool.reserve(page))
                    self._writing[page] = loop.create_future()
        except BaseException:  # e.g. Redis refused an eviction: readers must not wait on these
            await self.abandon(list(out))
            raise
        return out

    def _written(self, pages: list[Hashable]) -> None:
        for page in pages:
            if (done := self._writing.pop(page, None)) is not None:
                done.set_result(None)

    async def abandon(self, pages: list[Hashable]) -> None:
        """Reserved pages that will not be written (the save failed): free their slots."""
        for page in pages:
            if page in self._writing:
                self.pool.free(page)
        self._written(pages)

    async def commit(self, pages: list[Hashable], info: PageInfo = DEFAULT_INFO) -> None:
        """Pages now complete in L2: into the eviction order and published in Redis with their slots."""
        pages = list(dict.fromkeys(pages))
        self._written(pages)
        for page in pages:
            self._info[page] = info
            if page not in self._pins:  # held pages stay out of the eviction order
                self.policy.insert(page, info)
        by_tier: dict[str, list[Hashable]] = {}
        for page in pages:
            by_tier.setdefault(f"L2@{self.pool.slot_of(page)}", []).append(page)
        for tier, group in by_tier.items():
            await self.meta.publish(self.provider, tier, self.pool.layout.page_bytes, group)
        self._observe()

    async def pin(self, request_id: str, pages: list[Hashable]) -> bool:
        """A running request uses these pages: they may not be evicted anywhere until unpinned."""
        if not await self.meta.pin(request_id, pages):
            return False
        for page in pages:
            self._hold(page)
        return True

    async def unpin(self, request_id: str, pages: list[Hashable]) -> None:
        await self.meta.unpin(request_id, pages)
        self.release(pages)

    def _hold(self, page: Hashable) -> None:
        self._pins[page] = self._pins.get(page, 0) + 1
        if self._pins[page] == 1:
            self.policy.remove(page)

    def release(self, pages: list[Hashable]) -> None:
        """Pages held by `fetch` (or pinned) may be evicted again."""
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
    `skipped` (no provider holds it in L2: the caller recomputes), `failed` (listed copies could not be
    read), `cancelled`; a consumer that has to
    wait for it marks it `late`. Cancelling is safe at any point: a page is either fully here or not."""

    def __init__(self, store: KvStore, pages: list[Hashable]):
        self.store, self.pages = store, list(pages)
        self.outcomes: dict[Hashable, str] = {}
        self.late = False
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        self.outcomes = dict.fromkeys(self.pages, "cancelled")  # until it finishes
        for page, outcome in (await self.store._bring(self.pages)).items():
            self.outcomes[page] = "done" if outcome in ("L3", "peer") else outcome

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
