"""A replica of a session pool (the realtime decode pool, services/router/session_seats.py): registered
while it runs, so gateways seat sessions on it; withdrawn the moment Serve begins draining it
(replica_drain.py), so its sessions move to the others at their next turn while the turns in flight
finish here. A replica that dies lapses after three periods."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ray import serve

from services.common.redis_config import UNAVAILABLE
from services.extensions.ray.replica_drain import replica_draining
from services.router.session_seats import SessionSeats

log = logging.getLogger("ray.serve")


async def hold_registration(seats: SessionSeats, every_s: float) -> None:
    """Register this replica every `every_s` until it drains, then withdraw it (run as a task)."""
    replica = serve.get_replica_context().replica_id.unique_id
    failing = False
    while replica_draining() is not True:
        try:
            await seats.register(replica, 3 * every_s)
            failing = False
        except UNAVAILABLE as e:  # it lapses: gateways stop seating sessions here meanwhile
            if not failing:
                log.warning("session pool: cannot register replica %s (Redis unavailable): %s", replica, e)
            failing = True
        await asyncio.sleep(every_s)
    with contextlib.suppress(*UNAVAILABLE):  # else it lapses on its own
        await seats.withdraw(replica)
    log.info("session pool: replica %s draining, its sessions move at their next turn", replica)
