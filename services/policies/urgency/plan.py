"""An urgency order kept from one scheduling round to the next, so that a round costs what changed,
not a classification and sort of every request (LiveServe's scheduler runs every decode step).

A request is classified again only when:
- it is new to the plan (membership delta: the list handed in differs from what the plan returned);
- its session's board view changed (the board reader keeps the object while a session's course is
  unchanged and logs which sessions changed: services/playback/board.py), unless the policy says the
  request's class is free of view changes (`view_free`) or of this one, more audio at the client
  (`refill_free`);
- its classification ran out (`Classified.until`, wall time), or is `refresh_s` old and its class
  reads what keys do not track (`UrgencyPolicy.refreshed`: a U2 score's KV and pool occupancy) —
  refreshes spread over rounds, not all at once. `refresh_s` 0 classifies every request every round
  (what the plan saves: the baseline of loadtest/benchmarks/scheduler_bench.py).
A paced request (`Classified.pace`) is released without classifying it again: a timer releases it
when playback has caught up, and a round count checks it again when it may be over its hold — it
gains at most `tokens_per_round` tokens a round on playback, which moves on at least the shortest
of the last rounds, counted for at most a quarter of what the tokens gain (`Pace.rounds_to_hold`:
rounds that get much shorter at once make a hold late by at most a third of the audio it had to
go). For a request that yields to turns, the count is of the rounds in which the yielding end of
the order ran (it generates nothing while it yields). Found over its hold, it is classified again
as it is held: its client's buffer has grown with what it generated, so its release and the time
it could fall to a lower class are timed on the buffer it has now.
Keys do not drift with time, so the rest keep their order without being looked at; a round with
nothing to do is a list comparison and a copy. The sorted order is mended in place (bisect) for a
few changes and rebuilt for many. The plan counts the turns in it (`Classified.turn`); the
requests that would yield to them are the end of the order (one bisect: `yielding`). A key that
changes at a known time (`Classified.rekey`: a yield running out) is moved then by a timer, like a
release, without a classification.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable, Hashable
from typing import Any

from services.playback.board import BoardView, BoardViews
from services.policies.urgency.base import HELD, NEVER, Candidate, Classified, UrgencyPolicy

REBUILD_FRACTION = 0.125  # more classifications than this share of the plan: sort it anew
ROUND_WINDOW = 64


class _Entry:
    __slots__ = ("item", "classified", "view", "session", "arrival", "check")

    def __init__(self, session: Hashable, arrival: float):
        self.session, self.arrival = session, arrival
        # (key, seq, request): seq tells which classification timers belong to. Until classified,
        # seq -1: a request back in the queue (preempted, resumed) meets its earlier stay's timers
        # before its first classification of this one.
        self.item: tuple = ((), -1, None)
        self.classified: Classified | None = None
        self.view: BoardView | None = None
        self.check = 0  # a yielding request's pending check (UrgencyPlan._tail_round)


class UrgencyPlan:
    """The order of one queue of requests (the engine's running or waiting requests).

    `identify(request) -> (session id or None, arrival)` is read once per request, `progress(request)
    -> (kv tokens, generated tokens)` at each classification and pacing check; requests are hashable
    (compared by identity) and the plan holds them only while they are handed in.
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
        # Entries' items, most urgent first, held ones not in it; `_order` is their requests, mended
        # at the same index (a round hands it out without building it).
        self._sorted: list[tuple] = []
        self._order: list = []
        self._held: dict[Any, None] = {}  # insertion-ordered set
        self._classes: Counter[str] = Counter()
        self._turns = 0
        self._rekeys: list[tuple[float, int, Any]] = []  # (time, seq, request): its key changes
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, Any]] = []  # (until, seq, request): classify again
        self._releases: list[tuple[float, int, Any]] = []  # (time, seq, request): release a held one
        self._checks: list[tuple[int, int, Any]] = []  # (round, seq, request): hold a running one?
        self._round = 0
        # The shortest of the last ROUND_WINDOW rounds (seconds; 0 until one is measured): a check
        # counts on playback moving on that much a round (an engine that sat idle between two
        # rounds does not stretch it).
        self._round_s, self._now = 0.0, None
        self._periods: deque[tuple[int, float]] = deque()  # (round, period)
        # Checks of requests keyed to yield (at or above the policy's `yields_from`) count the rounds
        # in which the order's yielding end ran: one that yields in most rounds is not checked in them.
        self._tail_from = policy.yields_from
        self._tail_checks: list[tuple[int, int, Any]] = []  # (tail round, seq, request)
        self._tail_round = 0
        # Whether the yielding end sat out the last two rounds (`yielding`): a round counts on its
        # clock if the end ran in either, since a token can land a round after it was scheduled
        # (vLLM's async scheduling).
        self._tail_yielded = (False, False)
        self._views: dict | None = None
        self._returned: list = []  # what the last round handed back, in order (held last)
        self.classified = 0  # classifications in the last round (benchmarks, tests)

    @property
    def classes(self) -> Counter[str]:
        """How many requests are in each class now (HELD for paced requests sitting rounds out)."""
        return self._classes

    @property
    def turns(self) -> int:
        """How many requests are realtime turns before their first audio (`Classified.turn`)."""
        return self._turns

    def yielding(self, order: list, held: list) -> int:
        """Move the requests that yield to a turn from `order` (what this round's `arrange` returned,
        as it is) to `held` (what it held back), least urgent first: the end of the order from the
        policy's `yields_from`. Returns how many."""
        cut = bisect.bisect_left(self._sorted, (self.policy.yields_from,))
        tail = order[cut:]
        del order[cut:]
        tail.reverse()
        held += tail
        self._tail_yielded = (self._tail_yielded[0], bool(tail))
        self._returned = order + held  # the round hands back what it returned: no membership change
        return len(tail)

    def class_of(self, request: Any) -> str:
        return HELD if request in self._held else self._entries[request].classified.cls

    def key_of(self, request: Any) -> tuple:
        return self._entries[request].item[0]

    def arrange(
        self, requests: list, views: dict[str, BoardView], now: float, occupancy: float
    ) -> tuple[list, list]:
        """(the requests to run, most urgent first; the ones held back this round). The first list
        is a fresh copy; the plan keeps its own."""
        self._round += 1
        if self._now is not None:
            # the window's minimum: periods increasing from its oldest round on
            elapsed, periods = max(0.0, now - self._now), self._periods
            while periods and periods[-1][1] >= elapsed:
                periods.pop()
            periods.append((self._round, elapsed))
            if periods[0][0] <= self._round - ROUND_WINDOW:
                periods.popleft()
            self._round_s = periods[0][1]
        self._now = now
        before, last = self._tail_yielded
        self._tail_round += not (before and last)
        self._tail_yielded = (last, False)
        dirty: set = set()
        if requests != self._returned:
            self._membership(requests, dirty)
        if views is not self._views:
            self._changed_views(views, dirty)
            self._views = views
        timers, releases, checks, tail_checks = self._timers, self._releases, self._checks, self._tail_checks
        if timers and timers[0][0] <= now:
            dirty.update(request for request, _ in self._fired(timers, now))
        if self._rekeys and self._rekeys[0][0] <= now:
            self._rekeyed(now)
        # Heads looked at here: most rounds release and check nothing.
        if releases and releases[0][0] <= now:
            self._released(now)
        if checks and checks[0][0] <= self._round:
            self._checked(checks, self._round, now, dirty)
        if tail_checks and tail_checks[0][0] <= self._tail_round:
            self._checked(tail_checks, self._tail_round, now, dirty)
        if self.refresh_s <= 0:  # the full classification this plan saves (benchmarks' baseline)
            dirty.update(self._entries)
        self.classified = len(dirty)
        if dirty:
            self._classify(dirty, views, now, occupancy)
        held = list(self._held)
        self._returned = self._order + held
        return self._order[:], held

    def _changed_views(self, views: dict, dirty: set) -> None:
        last = self._views
        changes = None
        if isinstance(views, BoardViews) and isinstance(last, BoardViews) and views.log is last.log:
            changes = views.changes_since(last.epoch)
        view_free, refill_free = self.policy.view_free, self.policy.refill_free
        if changes is not None:  # the reader's log: only the requests of sessions that changed
            free_of_refill, refilled = view_free | refill_free, changes.refilled
            by_session, entries = self._by_session, self._entries
            for session in changes.changed:
                requests = by_session.get(session)
                if requests is None:
                    continue
                free = free_of_refill if session in refilled else view_free
                for request in requests:
                    classified = entries[request].classified
                    if classified is not None and classified.cls not in free:  # new: classified anyway
                        dirty.add(request)
            return
        for request, entry in self._entries.items():  # no log: compare every request's view
            view = views.get(entry.session)
            if view is entry.view or entry.classified is None:  # unchanged, or new (classified anyway)
                continue
            cls = entry.classified.cls
            refill = entry.view is not None and view is not None and entry.view.refilled(view)
            if cls in view_free or (refill and cls in refill_free):
                entry.view = view
            else:
                dirty.add(request)

    def _membership(self, requests: list, dirty: set) -> None:
        """Take in the requests new to the plan (into `dirty`), drop the ones not handed in. A set
        of the requests is built only when some are gone (hashing them all costs as much as
        looking each up); the count that tells relies on the requests being distinct, as vLLM's
        queues are."""
        entries = self._entries
        new = [request for request in requests if request not in entries]
        if len(requests) - len(new) < len(entries):
            current = set(requests)
            for gone in [request for request in entries if request not in current]:
                self._drop(gone)
        for request in new:
            session, arrival = self.identify(request)
            entries[request] = _Entry(session, arrival)
            self._by_session.setdefault(session, set()).add(request)
        dirty.update(new)

    def _place(self, item: tuple) -> None:
        i = bisect.bisect_right(self._sorted, item)
        self._sorted.insert(i, item)
        self._order.insert(i, item[2])

    def _displace(self, item: tuple) -> None:
        i = bisect.bisect_left(self._sorted, item)
        del self._sorted[i]
        del self._order[i]

    def _unplace(self, request: Any, entry: _Entry, sorted_too: bool = True) -> None:
        """Take a classified entry out of its place (`sorted_too` False: the order is rebuilt)."""
        self._turns -= entry.classified.turn
        if request in self._held:
            self._classes[HELD] -= 1
            del self._held[request]
        else:
            self._classes[entry.classified.cls] -= 1
            if sorted_too:
                self._displace(entry.item)

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
            self._releases.clear()
            self._checks.clear()
            self._tail_checks.clear()
            self._rekeys.clear()

    def _fired(self, heap: list, upto: float):
        """Pop `heap`'s timers (time or round, seq, request) up to `upto`; yield (request, entry) of
        those set at the request's current classification (not gone, not classified again since)."""
        entries = self._entries
        while heap and heap[0][0] <= upto:
            _, seq, request = heapq.heappop(heap)
            entry = entries.get(request)
            if entry is not None and entry.item[1] == seq:
                yield request, entry

    def _classify(self, dirty: set, views: dict, now: float, occupancy: float) -> None:
        rebuild = len(dirty) > REBUILD_FRACTION * len(self._entries)
        # locals: this loop runs for every classification
        classify, progress, entries, next_seq = (
            self.policy.classify,
            self.progress,
            self._entries,
            self._seq.__next__,
        )
        unplace, pace, place, push = self._unplace, self._pace, self._place, heapq.heappush
        held_now, classes, timers = self._held, self._classes, self._timers
        refreshed, refresh_at, tail_from = self.policy.refreshed, now + self.refresh_s, self._tail_from
        for request in dirty:
            entry = entries[request]
            in_flight = False
            if entry.classified is not None:
                # ran last round, outside the yielding end: a token may be in flight (_pace)
                in_flight = tail_from is not None and request not in held_now and entry.item[0] < tail_from
                unplace(request, entry, not rebuild)
            view = views.get(entry.session) if entry.session is not None else None
            kv_tokens, generated = progress(request)
            c = classify(Candidate(entry.arrival, kv_tokens, generated, view), now, occupancy)
            seq = next_seq()
            entry.item, entry.classified, entry.view = (c.key, seq, request), c, view
            self._turns += c.turn
            if c.pace is not None and pace(request, entry, generated, now, None, in_flight):
                classes[HELD] += 1
                held_now[request] = None
            else:
                classes[c.cls] += 1
                if not rebuild:
                    place(entry.item)
                if c.rekey is not None:  # a held one's waits for its release (_released)
                    push(self._rekeys, (c.rekey[0], seq, request))
            until = min(c.until, refresh_at) if c.cls in refreshed else c.until
            if until != NEVER:
                push(timers, (until, seq, request))
        if rebuild:
            self._sorted = sorted(e.item for r, e in entries.items() if r not in held_now)
            self._order = [item[2] for item in self._sorted]
        pending = (
            len(timers) + len(self._releases) + len(self._checks) + len(self._tail_checks) + len(self._rekeys)
        )
        if pending > 4 * len(entries) + 64:
            self._compact()

    def _rekeyed(self, now: float) -> None:
        """Move the requests whose `Classified.rekey` time has come to their new key (a held one
        takes it when it is released: _released). One that no longer yields has its check moved to
        the round count: it runs every round now."""
        tail_from = self._tail_from
        # pushed only for a running request, at its classification or release: it is not held
        for request, entry in self._fired(self._rekeys, now):
            key = entry.classified.rekey[1]
            item = (key, entry.item[1], request)
            self._displace(entry.item)
            self._place(item)
            if (
                tail_from is not None
                and entry.item[0] >= tail_from > key
                and entry.classified.pace is not None
            ):
                rounds = max(0, entry.check - self._tail_round)
                heapq.heappush(self._checks, (self._round + rounds, item[1], request))
            entry.item = item

    def _pace(
        self,
        request: Any,
        entry: _Entry,
        generated: int,
        now: float,
        dirty: set | None = None,
        in_flight: bool = False,
    ) -> bool:
        """Whether the paced request is over its hold now. If it is, its release is timed — or,
        given `dirty`, it goes there to be classified again (which times it); if not, its next
        check is set: the round it may be over. `in_flight`: a token it was scheduled last round
        (vLLM's async scheduling) may land while the yielding end sits rounds out, which the end's
        clock does not count: checked a round early then."""
        pace, seq = entry.classified.pace, entry.item[1]
        ahead = pace.ahead(generated, now)
        if ahead > pace.hold_at(now):
            if dirty is None:
                heapq.heappush(self._releases, (pace.release_at(ahead, now), seq, request))
            else:
                dirty.add(request)
            return True
        rounds = pace.rounds_to_hold(ahead, now, self.tokens_per_round, self._round_s)
        if self._tail_from is not None and entry.item[0] >= self._tail_from:
            entry.check = self._tail_round + rounds - in_flight
            heapq.heappush(self._tail_checks, (entry.check, seq, request))
        else:
            heapq.heappush(self._checks, (self._round + rounds, seq, request))
        return False

    def _released(self, now: float) -> None:
        """Release the held requests whose release is due, on their key from then (a rekey waits
        for it). One over its hold again (a token that landed late) stays held: its release is
        timed anew."""
        held_now, classes, rekeys = self._held, self._classes, self._rekeys
        # popped first: a release timed anew at `now` (over its hold by less than the clock's
        # resolution) waits for the next round instead of being popped again here, for ever
        for request, entry in list(self._fired(self._releases, now)):
            rekey = entry.classified.rekey
            if rekey is not None and rekey[0] <= now:
                entry.item = (rekey[1], entry.item[1], request)
            if self._pace(request, entry, self.progress(request)[1], now):
                continue
            del held_now[request]
            self._place(entry.item)
            classes[entry.classified.cls] += 1
            classes[HELD] -= 1
            if rekey is not None and rekey[0] > now:
                heapq.heappush(rekeys, (rekey[0], entry.item[1], request))

    def _checked(self, heap: list, due: int, now: float, dirty: set) -> None:
        """Check the running paced requests whose check is due (`heap`: on the round count or the
        yielding end's). One found over its hold goes into `dirty`: classified again as it is
        held, since what its release is timed on (its client's buffer) has grown with the audio it
        generated."""
        tail = heap is self._tail_checks
        for request, entry in self._fired(heap, due):
            if tail and entry.item[0] < self._tail_from:
                continue  # it stopped yielding: its check was moved to the round count (_rekeyed)
            self._pace(request, entry, self.progress(request)[1], now, dirty)

    def _compact(self) -> None:
        """Drop the timers of requests gone or classified again since they were set."""
        live = {e.item[1] for e in self._entries.values()}
        # in place: a round in progress holds these lists (arrange)
        for heap in (self._timers, self._releases, self._checks, self._tail_checks, self._rekeys):
            heap[:] = [t for t in heap if t[1] in live]
            heapq.heapify(heap)
