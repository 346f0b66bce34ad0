"""A gateway's side of the realtime decode pool (services/router/session_seats.py): a session takes
its seat when it opens — or is refused, every replica holding its cap — gives it back when it ends,
and keeps it meanwhile (renewed every `renew_s`, however long it stays quiet). A session that moves
to another gateway replica (a drain, a reconnect) keeps its seat: the seat is the session's, not the
connection's.

Redis unreachable: the session opens without a seat (counted); the router seats it at its first
turn, or routes it by its scorers until the store is back. The pool's cap holds for every session
that got a seat; a session never waits on Redis longer than one bounded call.
"""

from __future__ import annotations

import asyncio
import logging

from services.common.redis_config import UNAVAILABLE, async_client
from services.extensions.ray.metrics import metric
from services.models.profile import Profile
from services.router.session_seats import SessionSeats

log = logging.getLogger(__name__)
POOL = "realtime_decode"  # the profile's stage key of the pool


class PoolSeats:
    def __init__(self, profile: Profile):
        spec = profile.stages[POOL].sessions
        self.seats = SessionSeats(async_client(), POOL, spec.cap, spec.seat_ttl_s)
        self.renew_s = spec.renew_s
        self.refused = metric("omniray_realtime_pool_refused_total")
        self.gauge = metric("omniray_realtime_pool_seats")
        self._held: set[str] = set()  # this replica's sessions (tenant-scoped keys) with a seat
        self._renewer: asyncio.Task | None = None

    @classmethod
    def of(cls, profile: Profile) -> PoolSeats | None:
        """The profile's pool seats; None without a realtime decode pool."""
        return cls(profile) if POOL in profile.stages else None

    async def take(self, session: str) -> bool:
        """A seat for the session (kept if it has one: a resumed session); False when the pool is full."""
        try:
            placement = await self.seats.place(session)
        except UNAVAILABLE as e:
            log.warning("realtime pool seats unreachable: session %s opens unseated: %s", session, e)
            return True
        if placement.replica is None:
            self.refused.inc()
            return False
        self._held.add(session)
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew())
        return True

    async def give_back(self, session: str) -> None:
        self._held.discard(session)
        try:
            await self.seats.release(session)
        except UNAVAILABLE:  # it lapses after seat_ttl_s
            log.warning("realtime pool seats unreachable: %s's seat lapses on its own", session)

    def moved(self, session: str) -> None:
        """The session went on elsewhere with its seat (its new gateway renews it)."""
        self._held.discard(session)

    async def _renew(self) -> None:
        """Every `renew_s` (the first round at once: the gauge from the first session on)."""
        while True:
            try:
                await self.seats.renew(sorted(self._held))
                held = await self.seats.occupancy()
            except UNAVAILABLE as e:
                log.warning("realtime pool seats unreachable: not renewed this round: %s", e)
            else:
                self.gauge.set(sum(held.values()), tags={"state": "held"})
                self.gauge.set(len(held) * self.seats.cap, tags={"state": "all"})
            await asyncio.sleep(self.renew_s)
