"""Where the services find their Redis (quota buckets, tenants, session board), and the one way
they connect to it.

Every wait on Redis is bounded: a stalled server (SIGSTOP, a full network queue) accepts a TCP
connection and then answers nothing, so without a read timeout a caller waits forever. The
defaults below fit the request path (Redis answers in ~30 µs on a healthy node); a deployment
overrides them in the URL itself, which redis-py reads:
`redis://host:6379/0?socket_timeout=1&socket_connect_timeout=1` — the same URL reaches every
process (gateways, engines, the KV store), so one setting changes them all.
"""

from __future__ import annotations

import os

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff

ENV = "OMNIRAY_REDIS_URL"  # the local runtime sets it for every process it starts
SOCKET_TIMEOUT_S = 0.5  # a read or write that takes longer fails (redis.TimeoutError)
CONNECT_TIMEOUT_S = 0.5
# What a caller sees when Redis is down, stalled or restarting, or refuses writes for a while: a
# replica after a failover (READONLY), a full one (OOM), a slot moving (TRYAGAIN) — not a script's
# or a command's own error.
UNAVAILABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.TryAgainError,
)


def redis_url() -> str:
    return os.environ.get(ENV, "redis://127.0.0.1:6379/0")


def _options(retry_cls, timeout_s: float | None = None) -> dict:
    # One immediate retry, on a dropped connection only: the first command after Redis restarts
    # finds its pooled connection closed and succeeds on a new one. A timeout is not retried, so a
    # stalled Redis costs one SOCKET_TIMEOUT_S per call, not several.
    retry = retry_cls(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    return {
        "socket_timeout": timeout_s or SOCKET_TIMEOUT_S,
        "socket_connect_timeout": timeout_s or CONNECT_TIMEOUT_S,
        "retry": retry,
    }


def async_client(url: str | None = None) -> aioredis.Redis:
    """An asyncio client of `url` (default $OMNIRAY_REDIS_URL); options in the URL win."""
    from redis.asyncio.retry import Retry

    return aioredis.Redis.from_url(url or redis_url(), **_options(Retry))


def sync_client(url: str | None = None, timeout_s: float | None = None) -> redis.Redis:
    """A blocking client (for threads) of `url` (default $OMNIRAY_REDIS_URL); options in the URL win.
    `timeout_s`: a tighter bound on connects, reads and writes than the default."""
    from redis.retry import Retry

    return redis.Redis.from_url(url or redis_url(), **_options(Retry, timeout_s))
