"""An urgency order kept from one scheduling round to the next, so that a round costs what changed,
not a classification and sort of every request (LiveServe's scheduler runs every decode step).

A request is classified again only when:
- it is new to the plan (membership delta: the list handed in differs from what the plan returned);
- its session's board view is another object (the board reader keeps the object while a session's
  course is unchanged and logs which sessions changed: services/playback/board.py) and the policy
  does not say it `keeps` the classification;
- its classification ran out: `Classified.until` (wall time) or `Classified.tokens` (generated
  tokens, counted as rounds of at most `tokens_per_round` each);
- every `refresh_s`, all of them (what keys do not track: a U2 score's KV and pool occupancy).
The keys of the rest keep their order without being looked at (keys do not drift with time), so a
round with nothing to classify is a list comparison and a copy. The sorted order is mended in place
(bisect) for a few changes and rebuilt for many.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

from services.playback.board import BoardView, BoardViews
from services.policies.urgency.base import HELD, NEVER, Candidate, Classified, UrgencyPolicy

REBUILD_FRACTION = 0.125  # more classifications than this share of the plan: sort it anew


class _Entry:
    __slots__ = ("item", "classified", "view", "session", "arrival")

    def __init__(self, session: Hashable, arrival: float):
        self.session, self.arrival = session, arrival
        self.item: tuple = ()
        self.classified: Classified | None = None
        self.view: BoardView | None = None


class UrgencyPlan:
    """The order of one queue of requests (the engine's running or waiting requests).

    `identify(request) -> (session id or None, arrival)` is read once per request, `progress(request)
    -> (kv tokens, generated tokens)` at each classification; requests are hashable (compared by
    identity) and the plan holds them only while they are handed in.
    """

    def __init__(
        self,
        policy: UrgencyPolicy,
        identify: Callable[[Any], tuple[Hashable, float]],
        progress: Callable[[Any], tuple[int, int]],
        refresh_s: float = 5.0,
        tokens_per_round: int = 1,
    ):
        self.policy, self.identify, self.progress = policy, identify, progress
        self.refresh_s, self.tokens_per_round = refresh_s, max(1, tokens_per_round)
        self._entries: dict[Any, _Entry] = {}
        self._by_session: dict[Hashable, set] = {}
        self._sorted: list[tuple] = []  # (key, seq, request), most urgent first; held ones not in it
        self._held: dict[Any, None] = {}  # insertion-ordered set
        self._classes: Counter[str] = Counter()
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, Any]] = []  # (until, seq, request)
        self._counters: list[tuple[int, int, Any]] = []  # (round, seq, request)
        self._round = 0
        self._views: dict | None = None
        self._refresh_at = -NEVER
        self._order: list = []
        self._returned: list = []  # what the last round handed back, in order (held last)
        self.classified = 0  # classifications in the last round (benchmarks, tests)

    @property
    def classes(self) -> Counter[str]:
        """How many requests are in each class now."""
        return self._classes

    def class_of(self, request: Any) -> str:
        return self._entries[request].classified.cls

    def key_of(self, request: Any) -> tuple:
        return self._entries[request].item[0]

    def arrange(
        self, requests: list, views: dict[str, BoardView], now: float, occupancy: float
    ) -> tuple[list, list]:
        """(the requests to run, most urgent first; the ones held back this round). The first list
        is a fresh copy; the plan keeps its own."""
        self._round += 1
        dirty: set = set()
        moved = requests != self._returned
        if moved:
            dirty |= self._membership(requests)
        if now >= self._refresh_at:
            self._refresh_at = now + self.refresh_s
            dirty.update(self._entries)
        elif views is not self._views:
            self._changed_views(views, dirty)
        self._views = views
        self._expired(self._timers, now, dirty)
        self._expired(self._counters, self._round, dirty)
        self.classified = len(dirty)
        if dirty:
            self._classify(dirty, views, now, occupancy)
        if dirty or moved:
            self._order = [item[2] for item in self._sorted]
        held = list(self._held)
        self._returned = self._order + held
        return list(self._order), held

    def _changed_views(self, views: dict, dirty: set) -> None:
        last = self._views
        sessions = None
        if isinstance(views, BoardViews) and isinstance(last, BoardViews) and views.log is last.log:
            sessions = views.changes_since(last.epoch)
        if sessions is None:
            sessions = self._by_session.keys()
        keeps, entries = self.policy.keeps, self._entries
        for session in sessions:
            requests = self._by_session.get(session)
            if not requests:
                continue
            view = views.get(session)
            for request in requests:
                entry = entries[request]
                if view is entry.view or entry.classified is None:  # unchanged, or new (classified anyway)
                    continue
                if keeps(entry.classified, entry.view, view):
                    entry.view = view
                else:
                    dirty.add(request)

    def _membership(self, requests: list) -> set:
        current = set(requests)
        for gone in self._entries.keys() - current:
            self._drop(gone)
        new = current - self._entries.keys()
        for request in new:
            session, arrival = self.identify(request)
            self._entries[request] = _Entry(session, arrival)
            self._by_session.setdefault(session, set()).add(request)
        return new

    def _unplace(self, request: Any, entry: _Entry) -> None:
        cls = entry.classified.cls
        self._classes[cls] -= 1
        if cls == HELD:
            del self._held[request]
        else:
            del self._sorted[bisect.bisect_left(self._sorted, entry.item)]

    def _drop(self, request: Any) -> None:
        entry = self._entries.pop(request)
        sessions = self._by_session[entry.session]
        sessions.discard(request)
        if not sessions:
            del self._by_session[entry.session]
        if entry.classified is not None:
            self._unplace(request, entry)
        if not self._entries:  # timers of requests gone: start clean
            self._timers.clear()
            self._counters.clear()

    def _expired(self, heap: list, now: float, dirty: set) -> None:
        while heap and heap[0][0] <= now:
            _, seq, request = heapq.heappop(heap)
            entry = self._entries.get(request)
            if entry is not None and entry.item[1] == seq:  # not classified again since
                dirty.add(request)

    def _classify(self, dirty: set, views: dict, now: float, occupancy: float) -> None:
        rebuild = len(dirty) > REBUILD_FRACTION * len(self._entries)
        classify, progress, entries, held = self.policy.classify, self.progress, self._entries, self._held
        for request in dirty:
            entry = entries[request]
            if entry.classified is not None and (rebuild or entry.classified.cls == HELD):
                self._classes[entry.classified.cls] -= 1
                if entry.classified.cls == HELD:
                    del held[request]
            elif entry.classified is not None:
                self._unplace(request, entry)
            view = views.get(entry.session) if entry.session is not None else None
            kv_tokens, generated = progress(request)
            c = classify(Candidate(entry.arrival, kv_tokens, generated, view), now, occupancy)
            seq = next(self._seq)
            entry.item, entry.classified, entry.view = (c.key, seq, request), c, view
            self._classes[c.cls] += 1
            if c.cls == HELD:
                held[request] = None
            elif not rebuild:
                bisect.insort(self._sorted, entry.item)
            if c.until < NEVER:
                heapq.heappush(self._timers, (c.until, seq, request))
            if c.tokens < NEVER:
                rounds = max(1, int(c.tokens) // self.tokens_per_round)
                heapq.heappush(self._counters, (self._round + rounds, seq, request))
        if rebuild:
            self._sorted = sorted(e.item for e in entries.values() if e.classified.cls != HELD)
        if len(self._timers) + len(self._counters) > 4 * len(entries) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the timers of requests gone or classified again since they were set."""
        live = {e.item[1] for e in self._entries.values()}
        self._timers = [t for t in self._timers if t[1] in live]
        self._counters = [t for t in self._counters if t[1] in live]
        heapq.heapify(self._timers)
        heapq.heapify(self._counters)
