"""Next-use order of vLLM's free KV blocks (LiveServe's next-use eviction and speech-triggered
preload, in the engine's own GPU pool): vLLM evicts cached blocks from the head of its free queue,
least recently freed first. A session's blocks whose next use is near — the user speaks, or has just
heard a reply — go to the tail (evicted last: protected the moment speech starts, before the turn
reaches prefill); a session whose next use is far — quiet for long, or off the board — goes to the
head (evicted first). Others keep vLLM's LRU place.

The urgency hook (services/extensions/vllm/scheduler.py) calls it each round with the board's views;
it looks only at the sessions whose view changed since its last call (the board's change log), so a
round costs what changed. A session's blocks are found from its latest request's block hashes in
vLLM's prefix cache (`cached_block_hash_to_block`); only free ones (ref count 0) move, each chain
suffix-first, as vLLM frees a request's blocks. Predictions are kv_store.follower's `next_use`.

Written for vLLM 0.32's BlockPool (`free_block_queue.remove / append_n / prepend_n`,
`cached_block_hash_to_block.get_one_block`); tests/contracts/test_vllm_scheduler.py drives the real
one.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

from kv_store.follower import next_use
from services.extensions.vllm.specs import BlockOrderParams


class NextUseBlocks:
    def __init__(self, params: BlockOrderParams):
        self.p = params
        self.hashes: dict[str, list] = {}  # session -> its latest request's block hashes (vLLM's list)
        self._epoch: int | None = None
        self.moved = {"tail": 0, "head": 0}  # blocks moved since the caller last took the counts

    def saw(self, session: str, request: Any) -> None:
        """A running request of `session`: its blocks are the session's from now on."""
        self.hashes[session] = request.block_hashes

    def reorder(self, scheduler: Any, views: Any, now: float) -> None:
        log = getattr(views, "changes_since", None)  # the board's change log (a plain dict has none)
        changes = log(self._epoch) if log is not None and self._epoch is not None else None
        self._epoch = getattr(views, "epoch", None)
        changed = changes.changed if changes is not None else set(self.hashes)
        pool = scheduler.kv_cache_manager.block_pool
        groups = len(scheduler.kv_cache_manager.kv_cache_config.kv_cache_groups)
        for session in changed & self.hashes.keys():
            view = views.get(session)
            due = next_use(view, now, self.p.default_gap_s, self.p.idle_s) - now
            if due <= self.p.soon_s:
                self._move(pool, groups, self.hashes[session], to_tail=True)
            elif due >= self.p.late_s:
                self._move(pool, groups, self.hashes[session], to_tail=False)
            if view is None:
                del self.hashes[session]

    def _move(self, pool: Any, groups: int, hashes: list, to_tail: bool) -> None:
        free = []
        for group in range(groups):
            for h in hashes:
                block = pool.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(h, group))
                if block is None:
                    break  # a chain past an evicted block is no use: the rest is not looked at
                if block.ref_cnt == 0 and not block.is_null:
                    free.append(block)
        if not free:
            return
        for block in free:
            pool.free_block_queue.remove(block)
        free.reverse()  # suffix first: a chain's tail goes before its head, as vLLM frees
        if to_tail:
            pool.free_block_queue.append_n(free)
        else:
            pool.free_block_queue.prepend_n(free)
        self.moved["tail" if to_tail else "head"] += len(free)
