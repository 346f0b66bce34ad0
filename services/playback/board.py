"""The session board: the gateway's session-monitor views published to Redis, so that processes
without the monitor — the engines' scheduler, the KV store — read the same picture.

The gateway writes every open session's view into one hash (`omniray:sessions`, field = session id)
every `interval_s`, stamped with wall-clock time; readers poll the hash on a thread and keep the
latest dict, so a scheduling round reads memory, never Redis. A view carries the time it was taken:
readers extrapolate playback to their own now (audio plays in real time); stale views are dropped by the
reader, and a view whose course did not change stays the same object.

Redis down or stalled: every call is bounded by the client's timeouts (services/common/redis_config);
the writer skips rounds, the readers keep their last views until they would be stale, then have
none, so the engines' scheduler falls back to FCFS; both pick up again when Redis answers, and log only the change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import threading
import time
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

from services.common.redis_config import sync_client
from services.playback.monitor import PlaybackMonitor, PlaybackView

KEY = "omniray:sessions"
# A reader keeps a session's view object while newer ones tell the same course: within
# COURSE_TOLERANCE_MS of playback as the kept one extrapolates it (so errors do not add up).
COURSE_TOLERANCE_MS = 20.0
STALE_S = 2.0
CHANGE_LOG = 64  # polls a reader can fall behind and still be told only what changed  # a session not published for this long is no telemetry (its gateway is gone)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BoardView(PlaybackView):
    """A monitor view as read from the board: `buffered_ms` and `played_ms` as of `at`."""

    at: float = 0.0  # wall clock (time.time()) when the view was taken: the origin of its course

    def buffered_at(self, now: float) -> float:
        """Audio still buffered at the client at `now` (it plays in real time)."""
        return max(0.0, self.buffered_ms - max(0.0, now - self.at) * 1000) if self.playing else 0.0

    def played_at(self, now: float) -> float:
        """The client's playback position in the current response's audio at `now`."""
        return self.played_ms + (self.buffered_ms - self.buffered_at(now))

    def same_course(self, newer: BoardView, tolerance_ms: float = COURSE_TOLERANCE_MS) -> bool:
        """Whether `newer`, a later view of the session, says nothing this one does not (its state
        as this one extrapolates it, within `tolerance_ms`)."""
        return (
            self.refilled(newer, tolerance_ms)
            and newer.buffered_ms <= self.buffered_at(newer.at) + tolerance_ms
        )

    def refilled(self, newer: BoardView, tolerance_ms: float = COURSE_TOLERANCE_MS) -> bool:
        """Whether `newer` is this course with, at most, more audio reached the client since: the
        same state, the same playback position, no less buffered."""
        return (
            _state(newer) == _state(self)
            and abs(self.played_at(newer.at) - newer.played_ms) <= tolerance_ms
            and newer.buffered_ms >= self.buffered_at(newer.at) - tolerance_ms
        )


# Everything but what moves with playback or the clock (compared by extrapolation instead).
_state = operator.attrgetter(
    *(f.name for f in fields(BoardView) if f.name not in {"buffered_ms", "played_ms", "age_s", "at"})
)


def encode(monitor: PlaybackMonitor, now: float) -> dict[str, str]:
    return {sid: json.dumps({**asdict(v), "at": now}) for sid, v in monitor.snapshot().items()}


class Changes(NamedTuple):
    changed: set[str]  # sessions whose view is another object (new, changed in course, gone)
    refilled: set[str]  # those of them whose every change was only more audio (BoardView.refilled)


class BoardViews(dict):
    """A poll's views (session id → view) and a log of what changed per poll: `changes_since`
    spares a reader comparing every session."""

    def __init__(self, views: dict, epoch: int = 0, log: dict | None = None):
        super().__init__(views)
        self.epoch = epoch
        # epoch -> Changes, the last CHANGE_LOG polls; looked up by epoch (the poll thread adds and
        # trims meanwhile: no iteration here), so a reader one poll behind pays one lookup
        self.log: dict[int, Changes] = log if log is not None else {}

    def changes_since(self, epoch: int) -> Changes | None:
        """What changed after `epoch`; None when the log no longer reaches back."""
        if epoch == self.epoch - 1:  # the usual reader: one poll behind
            return self.log.get(self.epoch)
        if epoch < self.epoch - CHANGE_LOG:
            return None
        entries = [self.log.get(e) for e in range(epoch + 1, self.epoch + 1)]
        if None in entries:
            return None
        changed: set[str] = set().union(*(c.changed for c in entries))
        other: set[str] = set().union(*(c.changed - c.refilled for c in entries))
        return Changes(changed, changed - other)


def decode(raw: dict, previous: dict[str, BoardView] | None = None, now: float | None = None,
           stale_s: float = STALE_S) -> BoardViews:  # fmt: skip
    """The board's fresh views (published within `stale_s` of `now`); a session whose course is
    unchanged keeps its `previous` view object — so readers find what changed by identity or in
    the log (services/policies/urgency/plan.py), and a kept view's `at` says nothing of its
    freshness."""
    views = {}
    previous = previous or {}
    now = time.time() if now is None else now
    changed, refilled = set(previous.keys()), set()
    for sid, value in raw.items():
        sid = sid.decode() if isinstance(sid, bytes) else sid
        try:
            view = BoardView(**json.loads(value))
        except (TypeError, ValueError):
            continue  # a view from another version: no telemetry for that session
        if now - view.at > stale_s:
            continue  # its gateway stopped publishing
        view, is_changed, is_refilled = follow(previous.get(sid), view)
        if is_changed:
            changed.add(sid)
            if is_refilled:
                refilled.add(sid)
        else:
            changed.discard(sid)
        views[sid] = view
    return advance(previous, views, changed, refilled)


def follow(kept: BoardView | None, view: BoardView) -> tuple[BoardView, bool, bool]:
    """What a reader keeps of a session's newer `view`: the `kept` object while the course is the
    same; else the new one, and whether it only says that more audio reached the client."""
    if kept is not None and kept.same_course(view):
        return kept, False, False
    return view, True, kept is not None and kept.refilled(view)


def advance(previous: dict, views: dict[str, BoardView], changed: set[str], refilled: set[str]) -> BoardViews:
    """The next poll's views after `previous`, with what changed logged."""
    if isinstance(previous, BoardViews):
        out = BoardViews(views, previous.epoch + 1, previous.log)
    else:
        out = BoardViews(views, 1)
    out.log[out.epoch] = Changes(changed, refilled)
    out.log.pop(out.epoch - CHANGE_LOG, None)
    return out


class BoardWriter:
    """Runs in the gateway replica's event loop."""

    def __init__(self, monitor: PlaybackMonitor, redis, interval_s: float = 0.05):
        self.monitor, self.redis, self.interval_s = monitor, redis, interval_s
        self._written: set[str] = set()
        self._failing = False

    async def publish(self) -> None:
        views = encode(self.monitor, time.time())
        gone = self._written - views.keys()
        if not views and not gone:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            if views:
                pipe.hset(KEY, mapping=views)
            if gone:
                pipe.hdel(KEY, *gone)
            await pipe.execute()
        self._written = set(views)

    async def run(self) -> None:
        while True:
            try:
                await self.publish()
            except Exception as e:  # Redis away: readers see stale views and fall back to FCFS
                if not self._failing:  # once per outage, not every interval_s
                    log.warning("session board: publish failed, retrying every %gs: %s", self.interval_s, e)
                self._failing = True
            else:
                if self._failing:
                    log.warning("session board: publishing again")
                self._failing = False
            await asyncio.sleep(self.interval_s)


class BoardReader:
    """Polls the board on a daemon thread; `views()` is the latest copy (no I/O): fresh views only,
    so a reader never checks freshness itself."""

    def __init__(self, redis_url: str, interval_s: float = 0.05, stale_s: float = STALE_S):
        self.client = sync_client(redis_url)
        self.interval_s, self.stale_s = interval_s, stale_s
        self._views: BoardViews = BoardViews({})
        threading.Thread(target=self._poll, name="omniray-session-board", daemon=True).start()

    def _poll(self) -> None:
        read_at = time.time()
        while True:
            try:
                raw = self.client.hgetall(KEY)
            except Exception:  # unreachable: the last views stand until they would be stale
                if self._views and time.time() - read_at > self.stale_s:
                    self._views = decode({}, self._views)
            else:
                read_at = time.time()
                self._views = decode(raw, self._views, read_at, self.stale_s)
            time.sleep(self.interval_s)

    def views(self) -> BoardViews:
        return self._views
