"""A replica's KV pages on the simulated clock: the device pool vLLM allocates from, with its prefix
cache, and a host tier below it — and the real policies that act on them.

- Device pool: `capacity` pages of `page_tokens` tokens (a page stands for a few of vLLM's blocks:
  the same allocation at a coarser grain). Running requests pin pages; a finished or preempted
  request's full pages of its conversation (`SimRequest.chain`) stay cached and evictable, in the
  order of a real eviction policy from `kv_store.eviction` (`lru`, `next_use`, …). A request that
  starts with its conversation's cached pages skips their prefill.
- Host tier (`host_pages` > 0): what the device evicts goes there (LRU), and a request admitted with
  pages there loads them at `bandwidth_bps` (its step waits) instead of recomputing them.
- Next use and speech-triggered preload: the real `kv_store.follower.PlaybackFollower` runs on this
  pool — it predicts each page's next use from the session board for `next_use`, and when a
  session starts speaking it preloads the session's pages back onto the device. This object offers
  the store interface it calls (`policy`, `here`, `evictable`, `meta.chain`, `prefetch`, …). Unlike
  omniray's store, whose L2 is host memory below vLLM, here the policies act on the device pool,
  where LiveServe designed them to (issue 60 part 4).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable
from types import SimpleNamespace

import simpy

from kv_store import eviction
from kv_store.eviction.base import PageInfo
from kv_store.follower import FollowerParams, PlaybackFollower


class Prefetch:
    """A preload in flight (what the follower reads of kv_store.store.Prefetch)."""

    def __init__(self, pool: KvPool, pages: list):
        self.pages, self.done, self._cancelled = pages, False, False
        self.process = pool.env.process(self._run(pool))

    def _run(self, pool: KvPool):
        yield pool.env.timeout(len(self.pages) * pool.page_bytes / pool.bandwidth_bps)
        if not self._cancelled:
            pool.bring(self.pages)
        self.done = True

    def cancel(self) -> None:
        self._cancelled = True


class KvPool:
    def __init__(self, env: simpy.Environment, capacity: int, page_tokens: int, page_bytes: float, *,
                 policy: str = "lru", host_pages: int = 0, bandwidth_bps: float = 25e9,
                 follower: dict | None = None):  # fmt: skip
        self.env, self.capacity, self.page_tokens, self.page_bytes = env, capacity, page_tokens, page_bytes
        self.host_pages, self.bandwidth_bps = host_pages, bandwidth_bps
        self.follower = (
            PlaybackFollower(self, FollowerParams(**(follower or {})), clock=lambda: env.now)
            if policy == "next_use" or follower is not None
            else None
        )
        extra = {"predict": self._predict} if policy == "next_use" else {}
        self.policy = eviction.create(policy, {}, **extra)
        self.pinned = 0
        self.cached: set[Hashable] = set()  # device pages in the prefix cache, evictable
        self.host: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self.chains: dict[str, int] = {}  # conversation -> its pages (positions 0..n-1)
        self.session_chain: dict[str, str] = {}  # session -> its conversation now (the cluster's)
        self.meta = SimpleNamespace(chain=self._chain)
        self.pool = SimpleNamespace(layout=SimpleNamespace(page_bytes=page_bytes))
        self.stats = collections.Counter()

    # ---- vLLM's side -----------------------------------------------------------------------------

    @property
    def usage(self) -> float:  # what vLLM's kv_cache_manager.usage says: pinned pages
        return self.pinned / self.capacity

    @property
    def block_pool(self):  # what the urgency hook reads of vLLM's: free pages, cached ones included
        return SimpleNamespace(get_num_free_blocks=lambda: self.capacity - self.pinned)

    def get_computed_blocks(self, request) -> tuple[None, int, int]:
        """vLLM's prefix lookup, without taking anything: the tokens the cached pages hold."""
        hit = 0
        while request.chain is not None and hit < (request.prompt - 1) // self.page_tokens:
            if (request.chain, hit) not in self.cached:
                break
            hit += 1
        return None, hit * self.page_tokens, 0

    def take(self, n: int) -> bool:
        """Pin `n` new pages, evicting cached ones by the policy; False when they cannot all come."""
        while self.capacity - self.pinned - len(self.cached) < n:
            victim = self.policy.victim()
            if victim is None:
                return False
            self._evict(victim)
        self.pinned += n
        return True

    def _evict(self, page: Hashable) -> None:
        self.policy.remove(page, evicted=True)
        self.cached.discard(page)
        self.stats["evicted"] += 1
        if self.host_pages:
            self.host[page] = None
            self.host.move_to_end(page)
            while len(self.host) > self.host_pages:
                self.host.popitem(last=False)

    def admit(self, request) -> int:
        """Tokens of the request's prompt its conversation's cached pages already hold (they are
        pinned for it); at least one token is always computed."""
        if request.chain is None:
            return 0
        hit = 0
        while hit < (request.prompt - 1) // self.page_tokens and (request.chain, hit) in self.cached:
            page = (request.chain, hit)
            self.cached.discard(page)
            self.policy.remove(page)
            hit += 1
        self.pinned += hit
        self.stats["hit_pages"] += hit
        self.stats["prompt_pages"] += (request.prompt - 1) // self.page_tokens
        return hit * self.page_tokens

    def release(self, request) -> None:
        """A request left the engine: its conversation's full pages stay cached."""
        self.pinned -= request.pages
        if request.chain is None:
            return
        full = min(request.pages, request.num_computed_tokens // self.page_tokens)
        self.chains[request.chain] = max(self.chains.get(request.chain, 0), full)
        pages = [(request.chain, i) for i in range(full)]
        for page in pages:
            self._cache(page, i=page[1])
        if self.follower is not None:
            self.follower.saw(request.session or request.chain, pages)

    def _cache(self, page: Hashable, i: int) -> None:
        if page in self.cached:
            self.policy.touch(page)
            return
        self.cached.add(page)
        self.host.pop(page, None)
        self.policy.insert(page, PageInfo(size=1, cost=1.0, position=i))

    def load_time(self, request) -> float:
        """Seconds to bring the request's pages from the host tier as it is admitted (the pages that
        follow its cached prefix there); they are then cached on the device."""
        if request.chain is None or not self.host:
            return 0.0
        need = (request.prompt - 1) // self.page_tokens
        i = 0
        while i < need and (request.chain, i) in self.cached:
            i += 1
        missing = []
        while i < need and (request.chain, i) in self.host:
            missing.append((request.chain, i))
            i += 1
        if not missing:
            return 0.0
        self.stats["loaded_pages"] += len(missing)
        self.bring(missing)
        return len(missing) * self.page_bytes / self.bandwidth_bps

    def bring(self, pages: list) -> None:
        """Host pages onto the device's cache (as many as free or evictable pages allow)."""
        for page in pages:
            if page not in self.host:
                continue
            if self.capacity - self.pinned - len(self.cached) < 1:
                victim = self.policy.victim()
                if victim is None:
                    return
                self._evict(victim)
            self._cache(page, page[1])

    # ---- the store interface kv_store.follower.PlaybackFollower calls ----------------------------

    def _predict(self, page) -> float:
        return self.follower.predict(page) if self.follower is not None else math.inf

    def evictable(self, page) -> bool:
        return page in self.cached

    def here(self, page) -> bool:
        return page in self.cached or page not in self.host  # not on the host: pinned, or nowhere

    async def _chain(self, session: str) -> list:
        chain = self.session_chain.get(session)
        return [(chain, i) for i in range(self.chains.get(chain, 0))] if chain else []

    def measured_bandwidth(self) -> float:
        return self.bandwidth_bps

    def record_prefetch(self, outcome: str, n: int) -> None:
        self.stats[f"preload_{outcome}"] += n

    async def prefetch(self, pages: list) -> Prefetch:
        self.stats["preload_pages"] += len(pages)
        return Prefetch(self, pages)

    def follow(self, views) -> None:
        """One board poll for the follower (its awaits never suspend here)."""
        if self.follower is None:
            return
        step = self.follower.step(views)
        try:
            step.send(None)
        except StopIteration:
            return
        raise RuntimeError("the follower waited on something the simulator does not provide")
