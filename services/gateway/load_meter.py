"""The load a gateway replica admits, by kind, added to running totals in Redis (`omniray:load`) for
the SLA autoscaling policy (services/extensions/ray/sla_autoscaling.py), which turns them into rates:
requests (realtime sessions' turns apart, as `realtime_requests`: the realtime decode pool serves
them), text tokens (with their output budget), image tiles and audio seconds of every admitted
request, and the realtime sessions open here (as session-seconds). Totals from every replica add up
in one hash. Each kind is also a Prometheus counter (`omniray_gateway_offered_load_total{kind}`).

Redis away: what was counted waits for the next flush (the policy sees a lower rate meanwhile and
Serve's default decides while the counters are unreadable); nothing blocks a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from services.extensions.ray.metrics import metric
from services.extensions.ray.sla_autoscaling import KEY, KINDS
from services.quota.service import Cost

log = logging.getLogger("ray.serve")


class LoadMeter:
    def __init__(self, redis, interval_s: float = 1.0):
        self.redis, self.interval_s = redis, interval_s
        self.sessions: Callable[[], int] = lambda: 0  # realtime sessions open here (the hub sets it)
        self._pending: Counter = Counter()
        self._counter = metric("omniray_gateway_offered_load_total", kind=KINDS)
        self._at = time.monotonic()
        self._task: asyncio.Task | None = None
        self._failing = False

    def add(self, cost: Cost, realtime: bool = False) -> None:
        """One admitted request, `realtime`: a realtime session's turn (called on the event loop)."""
        self._count("realtime_requests" if realtime else "requests", 1.0)
        self._count("text_tokens", cost.text_tokens)
        self._count("image_tiles", cost.image_tiles)
        self._count("audio_seconds", cost.audio_seconds)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())

    def _count(self, kind: str, amount: float) -> None:
        if amount:
            self._pending[kind] += amount
            self._counter.inc(amount, tags={"kind": kind})

    async def flush(self) -> None:
        now = time.monotonic()
        self._count("session_seconds", self.sessions() * (now - self._at))
        self._at = now
        if not self._pending:
            return
        sent, self._pending = self._pending, Counter()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for kind, amount in sent.items():
                    pipe.hincrbyfloat(KEY, kind, amount)
                await pipe.execute()
        except Exception as e:
            self._pending.update(sent)  # counted again at the next flush
            if not self._failing:
                log.warning("load meter: Redis unreachable, keeping the counts: %s", e)
            self._failing = True
        else:
            self._failing = False

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()
