"""Whether Ray Serve has begun draining this replica (scale-down, a rolling update, `serve.delete`).

Ray 2.60 tells user code nothing before a replica's graceful shutdown ends: it waits for ongoing
requests (a realtime session is one, for as long as it lasts) and calls `__del__` only after them, so
a replica cannot finish its sessions' turns and send them elsewhere. The replica object does set
`_shutting_down` the moment the drain begins; it is reached through the core worker's actor
instance. Written for Ray 2.60; driven against a real Serve in tests/contracts/test_ray_internals.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import ray

WRITTEN_FOR = "2.60"

if ".".join(ray.__version__.split(".")[:2]) != WRITTEN_FOR:
    raise RuntimeError(
        f"{__name__} was written for Ray {WRITTEN_FOR}.x, this is Ray {ray.__version__}: run "
        "tests/contracts against it and update WRITTEN_FOR"
    )

log = logging.getLogger(__name__)


def replica_draining() -> bool | None:
    """True once Serve began this replica's graceful shutdown; None outside a Serve replica (or a
    Ray whose replica no longer looks like this)."""
    worker = ray._private.worker.global_worker
    actor = getattr(worker, "actors", {}).get(getattr(worker, "actor_id", None))
    flag = getattr(getattr(actor, "_replica_impl", None), "_shutting_down", None)
    return flag if isinstance(flag, bool) else None


async def on_drain(callback: Callable[[], Awaitable[None]], interval_s: float) -> None:
    """Await `callback` once this replica starts draining (checked every `interval_s`)."""
    while (draining := replica_draining()) is False:
        await asyncio.sleep(interval_s)
    if draining is None:
        log.warning("cannot see this replica's drain (not a Ray %s Serve replica): sessions end with it",
                    WRITTEN_FOR)  # fmt: skip
        return
    await callback()
