"""KV page metadata in Redis: who provides each page (process and tier), which requests are using it,
session page chains, and prefix matching over chained page hashes. Every write is a Lua script, so a
check and the change it guards happen atomically: an eviction checks, in the same script as the
delete, that no running request has the page pinned, that no other holder has it locked, and that it
is not the last complete copy (unless the caller says it may drop it).

Redis down or stalled never stalls an engine: every call is bounded by the client's timeouts
(`connect`), and after a call finds Redis unreachable the calls of the next `cooldown_s` fail at
once without I/O (one timeout per cool-down, not one per call). Either way a call raises
`MetadataUnavailable` and is counted (`omniray_kv_redis_errors_total{op}`); callers skip the lookup
or save — a miss, recomputed, never a failed request. Session chains expire `chain_ttl_s` after
their last save or read, so sessions that never come back leave nothing behind in Redis.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from kv_store.metrics import Metrics

P = "omniray:kv"
# Defaults of the store's Redis client; `?socket_timeout=..&socket_connect_timeout=..` in the URL wins.
SOCKET_TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 0.5
COOLDOWN_S = 1.0
CHAIN_TTL_S = 3600.0
# Redis down, stalled or restarting (a script's own error is not one of these: it propagates).
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError)
log = logging.getLogger(__name__)


def connect(url: str) -> aioredis.Redis:
    """The store's Redis client: bounded waits; one immediate retry, only on a dropped connection
    (the first call after Redis restarts), never on a timeout (a stall costs one timeout)."""
    retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    return aioredis.Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=CONNECT_TIMEOUT_S, retry=retry
    )


class MetadataUnavailable(Exception):
    """Redis could not be asked (down, stalled, or failed within the cool-down): skip and recompute."""


class Breaker:
    """Open for `cooldown_s` after a failure: calls then fail at once. The first call after the
    cool-down goes to Redis again (and re-opens it if Redis is still away)."""

    def __init__(self, cooldown_s: float, clock: Callable[[], float] = time.monotonic):
        self.cooldown_s, self.clock = cooldown_s, clock
        self._open_until: float | None = None  # None: Redis answered last time

    @property
    def closed(self) -> bool:
        return self._open_until is None or self.clock() >= self._open_until

    def failed(self, cause: BaseException | None = None) -> None:
        if self._open_until is None:
            log.warning(
                "KV metadata: Redis unreachable (%s: %s); lookups and saves skipped (recomputed) until it answers",
                type(cause).__name__,
                cause,
            )
        self._open_until = self.clock() + self.cooldown_s

    def succeeded(self) -> None:
        if self._open_until is not None:
            log.warning("KV metadata: Redis answers again")
        self._open_until = None


# KEYS: none. ARGV: prefix, provider, tier, size, hash1, hash2, ...
PUBLISH = """
local p, provider, tier, size = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
for i = 5, #ARGV do
  local h = ARGV[i]
  redis.call('HSET', p .. ':prov:' .. h, provider, tier)
  redis.call('HSETNX', p .. ':page:' .. h, 'size', size)
  redis.call('SADD', p .. ':held:' .. provider, h)
end
return #ARGV - 4
"""

# ARGV: prefix, live_only (0/1), hash1, hash2, ... -> number of leading hashes that some provider
# holds (with live_only: some provider whose heartbeat has not lapsed)
MATCH = """
local p, live_only = ARGV[1], ARGV[2] == '1'
for i = 3, #ARGV do
  local prov = p .. ':prov:' .. ARGV[i]
  local held = false
  if live_only then
    for _, provider in ipairs(redis.call('HKEYS', prov)) do
      if redis.call('EXISTS', p .. ':alive:' .. provider) == 1 then held = true break end
    end
  else
    held = redis.call('HLEN', prov) > 0
  end
  if not held then return i - 3 end
end
return #ARGV - 2
"""

# Redis's own clock unless a caller (a test) passes now_ms.
_CLOCK = """
local function clock(arg)
  local now = tonumber(arg)
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# ARGV: prefix, request_id, ttl_ms, now_ms|"", hash1, ... -> 1 if all pinned, else 0 (none pinned)
PIN = (
    _CLOCK
    + """
local p, rid, now = ARGV[1], ARGV[2], clock(ARGV[4])
local expiry = now + tonumber(ARGV[3])
for i = 5, #ARGV do
  if redis.call('HLEN', p .. ':prov:' .. ARGV[i]) == 0 then return 0 end
end
for i = 5, #ARGV do
  local key = p .. ':pin:' .. ARGV[i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, expiry, rid)
  redis.call('PEXPIRE', key, expiry - now + 60000)  -- the set outlives its longest pin
end
return 1
"""
)

# ARGV: prefix, request_id, hash1, ...
UNPIN = """
local p, rid = ARGV[1], ARGV[2]
for i = 3, #ARGV do redis.call('ZREM', p .. ':pin:' .. ARGV[i], rid) end
return 1
"""

# ARGV: prefix, hash, holder, ttl_ms -> 1 if taken (or already ours)
LOCK = """
local key = ARGV[1] .. ':lock:' .. ARGV[2]
local cur = redis.call('GET', key)
if cur and cur ~= ARGV[3] then return 0 end
redis.call('SET', key, ARGV[3], 'PX', tonumber(ARGV[4]))
return 1
"""

UNLOCK = """
local key = ARGV[1] .. ':lock:' .. ARGV[2]
if redis.call('GET', key) == ARGV[3] then redis.call('DEL', key) end
return 1
"""

# ARGV: prefix, hash, provider, now_ms|"", allow_last (0/1), to_tier|""
# -> 'ok' | 'in_use' | 'locked' | 'last_copy' | 'absent'. With to_tier the copy is kept, moved to that
# tier (e.g. L2 -> L3 on the same node), so it is never the last copy lost.
EVICT = (
    _CLOCK
    + """
local p, h, provider, now, allow_last = ARGV[1], ARGV[2], ARGV[3], clock(ARGV[4]), ARGV[5] == '1'
local to_tier = ARGV[6]
local prov = p .. ':prov:' .. h
if redis.call('HEXISTS', prov, provider) == 0 then return 'absent' end
redis.call('ZREMRANGEBYSCORE', p .. ':pin:' .. h, '-inf', now)
if redis.call('ZCARD', p .. ':pin:' .. h) > 0 then return 'in_use' end
local holder = redis.call('GET', p .. ':lock:' .. h)
if holder and holder ~= provider then return 'locked' end
if to_tier ~= '' then
  redis.call('HSET', prov, provider, to_tier)
  return 'ok'
end
if redis.call('HLEN', prov) == 1 and not allow_last then return 'last_copy' end
redis.call('HDEL', prov, provider)
redis.call('SREM', p .. ':held:' .. provider, h)
if redis.call('HLEN', prov) == 0 then redis.call('DEL', p .. ':page:' .. h) end
return 'ok'
"""
)

# ARGV: prefix, provider -> pages it held (a dead process: its copies are gone)
DROP_PROVIDER = """
local p, provider = ARGV[1], ARGV[2]
local held = redis.call('SMEMBERS', p .. ':held:' .. provider)
for _, h in ipairs(held) do
  redis.call('HDEL', p .. ':prov:' .. h, provider)
  if redis.call('HLEN', p .. ':prov:' .. h) == 0 then redis.call('DEL', p .. ':page:' .. h) end
end
redis.call('DEL', p .. ':held:' .. provider)
return #held
"""


@dataclass(frozen=True)
class Providers:
    page: str
    holders: dict[str, str]  # provider id -> "tier" or "tier@slot" (slot in the provider's L2 pool)

    def tier(self, provider: str) -> str:
        return self.holders[provider].partition("@")[0]

    def slot(self, provider: str) -> int | None:
        _, at, slot = self.holders[provider].partition("@")
        return int(slot) if at else None


class KvMetadata:
    def __init__(
        self,
        redis,
        prefix: str = P,
        metrics: Metrics | None = None,
        cooldown_s: float = COOLDOWN_S,
        chain_ttl_s: float = CHAIN_TTL_S,
    ):
        self.redis, self.prefix, self.metrics = redis, prefix, metrics
        self.breaker = Breaker(cooldown_s)
        self.chain_ttl_ms = int(chain_ttl_s * 1000)
        self._scripts = {
            name: redis.register_script(src)
            for name, src in {
                "publish": PUBLISH,
                "match": MATCH,
                "pin": PIN,
                "unpin": UNPIN,
                "lock": LOCK,
                "unlock": UNLOCK,
                "evict": EVICT,
                "drop": DROP_PROVIDER,
            }.items()
        }

    @contextlib.contextmanager
    def _redis(self, op: str) -> Iterator[None]:
        """Around one operation's Redis calls: refused while the breaker is open, counted when
        Redis is unreachable, either way MetadataUnavailable."""
        if not self.breaker.closed:
            self._unavailable(op)
            raise MetadataUnavailable(f"{op}: Redis unreachable (cooling down)")
        try:
            yield
        except UNAVAILABLE as e:
            self.breaker.failed(e)
            self._unavailable(op)
            raise MetadataUnavailable(f"{op}: {type(e).__name__}") from e
        self.breaker.succeeded()

    def _unavailable(self, op: str) -> None:
        if self.metrics:
            self.metrics.redis_error(op)

    async def _run(self, name: str, *args) -> object:
        with self._redis(name):
            result = await self._scripts[name](keys=[], args=[self.prefix, *args])
        return result.decode() if isinstance(result, bytes) else result

    async def advertise(self, provider: str, address) -> None:
        """Where peers read `provider`'s pool (a transfer.PoolAddress)."""
        with self._redis("advertise"):
            await self.redis.hset(f"{self.prefix}:addr:{provider}", mapping=address.to_redis())

    async def address(self, provider: str):
        from kv_store.transfer import PoolAddress

        with self._redis("address"):
            raw = await self.redis.hgetall(f"{self.prefix}:addr:{provider}")
        return PoolAddress.from_redis(raw) if raw else None

    async def publish(self, provider: str, tier: str, size: int, pages: list[str]) -> None:
        """`provider` now holds complete copies of `pages` in `tier` ("L2@<slot>" for one page in
        its pool, so peers can read it)."""
        if pages:
            await self._run("publish", provider, tier, size, *pages)

    async def match(self, pages: list[str], live_only: bool = False) -> int:
        """How many leading pages of this chain some provider holds (the reusable prefix); with
        `live_only`, only providers whose heartbeat is current count."""
        return int(await self._run("match", "1" if live_only else "0", *pages)) if pages else 0

    async def heartbeat(self, provider: str, ttl_ms: int) -> None:
        """`provider` is alive for the next ttl_ms (a process that dies stops renewing it)."""
        with self._redis("heartbeat"):
            await self.redis.set(f"{self.prefix}:alive:{provider}", b"1", px=ttl_ms)

    async def alive(self, provider: str) -> bool:
        with self._redis("alive"):
            return bool(await self.redis.exists(f"{self.prefix}:alive:{provider}"))

    async def declare_dead(self, provider: str) -> int:
        """A provider could not be reached: forget its liveness and every copy it held."""
        with self._redis("declare_dead"):
            await self.redis.delete(f"{self.prefix}:alive:{provider}")
        return await self.drop_provider(provider)

    async def providers(self, page: str) -> Providers:
        (out,) = await self.providers_of([page])
        return out

    async def providers_of(self, pages: list[str]) -> list[Providers]:
        """Each page's providers, in one round trip (a long prompt's hundreds of pages on one
        connection, not one connection each: the client's pool holds 100)."""
        if not pages:
            return []
        with self._redis("providers"):
            pipe = self.redis.pipeline(transaction=False)
            for page in pages:
                pipe.hgetall(f"{self.prefix}:prov:{page}")
            raws = await pipe.execute()
        return [
            Providers(p, {k.decode(): v.decode() for k, v in raw.items()})
            for p, raw in zip(pages, raws, strict=True)
        ]

    async def pin(
        self, request_id: str, pages: list[str], now_ms: int | None = None, ttl_ms: int = 600_000
    ) -> bool:
        """Mark pages in use by a running request (until unpinned or ttl_ms passes, for requests whose
        process died); False (nothing pinned) if any page is gone."""
        now = "" if now_ms is None else now_ms
        return bool(await self._run("pin", request_id, ttl_ms, now, *pages)) if pages else True

    async def unpin(self, request_id: str, pages: list[str]) -> None:
        if pages:
            await self._run("unpin", request_id, *pages)

    async def lock(self, page: str, holder: str, ttl_ms: int = 30_000) -> bool:
        return bool(await self._run("lock", page, holder, ttl_ms))

    async def unlock(self, page: str, holder: str) -> None:
        await self._run("unlock", page, holder)

    async def evict(
        self,
        page: str,
        provider: str,
        now_ms: int | None = None,
        allow_last: bool = False,
        to_tier: str = "",
    ) -> str:
        """Drop `provider`'s copy (or, with `to_tier`, move it to that tier) if nothing forbids it;
        returns 'ok' or why not."""
        now = "" if now_ms is None else now_ms
        return str(await self._run("evict", page, provider, now, "1" if allow_last else "0", to_tier))

    async def drop_provider(self, provider: str) -> int:
        return int(await self._run("drop", provider))

    async def append_chain(self, session: str, pages: list[str]) -> None:
        """Pages saved for `session`, in order; its chain lives `chain_ttl_s` from now."""
        if pages:
            key = f"{self.prefix}:chain:{session}"
            with self._redis("append_chain"):
                async with self.redis.pipeline(transaction=True) as pipe:
                    await pipe.rpush(key, *pages).pexpire(key, self.chain_ttl_ms).execute()

    async def chain(self, session: str) -> list[str]:
        """The session's pages (a read is a use: the chain lives `chain_ttl_s` from now)."""
        key = f"{self.prefix}:chain:{session}"
        with self._redis("chain"):
            async with self.redis.pipeline(transaction=True) as pipe:
                pages, _ = await pipe.lrange(key, 0, -1).pexpire(key, self.chain_ttl_ms).execute()
        return [h.decode() for h in pages]
