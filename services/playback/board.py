"""The session board: the gateway's session-monitor views published to Redis, so that processes
without the monitor — the engines' scheduler, the KV store — read the same picture.

The gateway writes every open session's view into one hash (`omniray:sessions`, field = session id)
every `interval_s`, stamped with wall-clock time; readers poll the hash on a thread and keep the
latest dict, so a scheduling round reads memory, never Redis. A view carries the time it was taken:
readers extrapolate playback to their own now (audio plays in real time) and ignore stale views.

Redis down or stalled: every call is bounded by the client's timeouts (services/common/redis_config);
the writer skips rounds, the readers keep their last views, which go stale, so the engines'
scheduler falls back to FCFS; both pick up again when Redis answers, and log only the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass

from services.common.redis_config import sync_client
from services.playback.monitor import PlaybackMonitor, PlaybackView

KEY = "omniray:sessions"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BoardView(PlaybackView):
    """A monitor view as read from the board: `buffered_ms` and `played_ms` as of `at`."""

    at: float = 0.0  # wall clock (time.time()) when the view was taken

    def buffered_at(self, now: float) -> float:
        """Audio still buffered at the client at `now` (it plays in real time)."""
        return max(0.0, self.buffered_ms - max(0.0, now - self.at) * 1000) if self.playing else 0.0

    def played_at(self, now: float) -> float:
        """The client's playback position in the current response's audio at `now`."""
        return self.played_ms + (self.buffered_ms - self.buffered_at(now))

    def fresh(self, now: float, stale_s: float) -> bool:
        return now - self.at <= stale_s


def encode(monitor: PlaybackMonitor, now: float) -> dict[str, str]:
    return {sid: json.dumps({**asdict(v), "at": now}) for sid, v in monitor.snapshot().items()}


def decode(raw: dict) -> dict[str, BoardView]:
    views = {}
    for sid, value in raw.items():
        try:
            views[sid.decode() if isinstance(sid, bytes) else sid] = BoardView(**json.loads(value))
        except (TypeError, ValueError):
            continue  # a view from another version: no telemetry for that session
    return views


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
    """Polls the board on a daemon thread; `views()` is the latest copy (no I/O)."""

    def __init__(self, redis_url: str, interval_s: float = 0.05):
        self.client = sync_client(redis_url)
        self.interval_s = interval_s
        self._views: dict[str, BoardView] = {}
        threading.Thread(target=self._poll, name="omniray-session-board", daemon=True).start()

    def _poll(self) -> None:
        while True:
            # Unreachable: keep the last views; they go stale and are ignored.
            with contextlib.suppress(Exception):
                self._views = decode(self.client.hgetall(KEY))
            time.sleep(self.interval_s)

    def views(self) -> dict[str, BoardView]:
        return self._views
