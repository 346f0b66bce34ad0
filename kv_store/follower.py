"""Live session signals in the store (LiveServe's next-use KV and speech-triggered preload).

The gateway's session monitor reaches the engine processes through the session board (Redis; read by
a `reader` with `views()` — services/playback/board.py, configured by import path so this package
depends on no service code). Each `step`:

- **Next use.** Every page of a session this process has held gets a predicted time of next use:
  now while the user speaks; after the remaining playback plus the session's reply gap while a
  response plays or runs; between turns, `default_gap_s` plus the time since the session's last
  signal, at most `idle_s` (the user answers a reply within seconds, and a session quiet for long is
  the least likely to come back soon — the simulator found +`idle_s` for every session between
  turns evicting exactly the pages about to be used: planner/sim); never for a session no longer on
  the board. The `next_use` eviction policy reads `predict(page)`; pages whose prediction moved are
  re-ranked (`update_many`).
- **Preload.** When a session starts speaking (or barges in), its chain is brought into L2 in the
  background — if the pages missing here fit in the time before the turn can reach prefill
  (`deadline_s`, at the bandwidth transfers have been measured at) and the preloads in flight stay
  under `max_pages`. A preload that has not finished when the turn loads is waited for or bypassed by
  the load path (the synchronous fallback); correctness never depends on it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FollowerParams:
    idle_s: float = 30.0  # an idle session's next use, from now, at the latest
    default_gap_s: float = 1.0  # reply gap when the session has none measured yet; the user's, between turns
    preload: bool = True
    deadline_s: float = 0.5  # time from speech start until the turn can reach prefill (>= VAD silence)
    max_pages: int = 4096  # preloaded pages in flight, in total
    bandwidth_bps: float = 1e9  # until transfers have been measured
    reprioritize_s: float = 0.25  # a prediction moving less than this does not re-rank pages


@dataclass
class _Session:
    pages: set = field(default_factory=set)
    next_use: float = math.inf
    speaking: bool = False
    barge_ins: int = 0


class PlaybackFollower:
    def __init__(self, store, params: FollowerParams, clock: Callable[[], float] = time.time):
        self.store, self.p, self.clock = store, params, clock
        self.sessions: dict[str, _Session] = {}
        self.page_session: dict[Hashable, str] = {}
        self.preloads: dict[str, Any] = {}  # session -> Prefetch in flight

    # ---- what the connector tells it ------------------------------------------------------------

    def saw(self, session: str, pages) -> None:
        """Pages of `session` were saved or loaded here."""
        s = self.sessions.setdefault(session, _Session())
        for page in pages:
            s.pages.add(page)
            self.page_session[page] = session

    def predict(self, page: Hashable) -> float:
        session = self.page_session.get(page)
        return self.sessions[session].next_use if session is not None else math.inf

    # ---- each board poll ------------------------------------------------------------------------

    def _next_use(self, view, now: float) -> float:
        return next_use(view, now, self.p.default_gap_s, self.p.idle_s)

    async def step(self, views: dict) -> None:
        now = self.clock()
        for sid, s in self.sessions.items():
            view = views.get(sid)
            before, s.next_use = s.next_use, self._next_use(view, now)
            if _moved(before, s.next_use, self.p.reprioritize_s) and hasattr(
                self.store.policy, "update_many"
            ):
                self.store.policy.update_many(p for p in s.pages if self.store.evictable(p))
            started = view is not None and view.speaking and not s.speaking
            barged = view is not None and view.barge_ins > s.barge_ins
            if view is not None:
                s.speaking, s.barge_ins = view.speaking, view.barge_ins
            if self.p.preload and (started or barged):
                await self._preload(sid)
        self._forget(views)

    async def _preload(self, sid: str) -> None:
        if sid in self.preloads and not self.preloads[sid].done:
            return
        chain = await self.store.meta.chain(sid)
        missing = [p for p in chain if not self.store.here(p)]
        if not missing:
            return
        in_flight = sum(len(p.pages) for p in self.preloads.values() if not p.done)
        bandwidth = self.store.measured_bandwidth() or self.p.bandwidth_bps
        eta = len(missing) * self.store.pool.layout.page_bytes / bandwidth
        if eta > self.p.deadline_s or in_flight + len(missing) > self.p.max_pages:
            self.store.record_prefetch("refused", len(missing))
            return
        self.preloads[sid] = await self.store.prefetch(missing)

    def _forget(self, views: dict) -> None:
        """Sessions gone from the board: cancel their preloads; pages no longer here leave the map."""
        for sid in [s for s in self.preloads if s not in views or self.preloads[s].done]:
            prefetch = self.preloads.pop(sid)
            if not prefetch.done:
                prefetch.cancel()
        for sid in [s for s, state in self.sessions.items() if s not in views and math.isinf(state.next_use)]:
            for page in self.sessions.pop(sid).pages:
                self.page_session.pop(page, None)


def next_use(view, now: float, default_gap_s: float, idle_s: float) -> float:
    """When a session's KV is next needed, from its board view (None: not on the board, never)."""
    if view is None:
        return math.inf
    if view.speaking:
        return now
    gap = (view.reply_gap_ms / 1000) if view.reply_gap_ms else default_gap_s
    if view.responding or view.playing:
        return now + view.buffered_at(now) / 1000 + gap
    quiet = view.age_s + max(0.0, now - view.at)  # since its last signal (a kept view is older)
    return now + min(idle_s, default_gap_s + quiet)


def _moved(before: float, after: float, eps: float) -> bool:
    if math.isinf(before) or math.isinf(after):
        return before != after
    return abs(after - before) >= eps
