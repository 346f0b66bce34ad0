"""Token buckets and concurrency leases in Redis, changed only by atomic Lua scripts.

One `admit` call checks and debits every bucket a request touches (tenant x modality) and takes a
concurrency lease, all or nothing, so 50 gateways debiting one bucket at once never overspend.
Time is Redis's own clock (`TIME`) unless a test passes `now_ms`, so gateways' clocks never matter.
A bucket refills continuously at its per-minute budget / 60 per second and holds at most its
capacity (the tenant's burst: `burst_s` seconds of budget).
"""

from __future__ import annotations

from dataclasses import dataclass

# KEYS[1] = concurrency zset, KEYS[2..] = buckets
# ARGV: now_ms|"", request_id, max_concurrent (0 = none), lease_ms, then per bucket: per-minute
# budget, capacity, cost
# Returns {ok, wait_ms, reason, level_1, reset_ms_1, level_2, reset_ms_2, ...}; levels as strings
# (a Lua number returned to Redis is truncated to an integer).
ADMIT = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local id, max_conc, lease = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local n = #KEYS - 1
local levels, out = {}, {}
local wait, reason = 0, ''
for i = 1, n do
  local base = 2 + 3 * i
  local rate = tonumber(ARGV[base]) / 60000.0
  local cap, cost = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local b = redis.call('HMGET', KEYS[i + 1], 'level', 'ts')
  local level, ts = tonumber(b[1]), tonumber(b[2])
  if not level then level, ts = cap, now end
  if now > ts then level = math.min(cap, level + (now - ts) * rate); ts = now end
  levels[i] = {level, ts, cost, cap, rate}
  if level < cost then
    local w = (cost > cap) and -1 or math.ceil((cost - level) / rate)
    if w < 0 or (wait >= 0 and w > wait) then wait = w end
    reason = 'bucket'
  end
end
if reason == '' and max_conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZSCORE', KEYS[1], id) == false and redis.call('ZCARD', KEYS[1]) >= max_conc then
    reason = 'concurrency'
    wait = 1000
  end
end
local ok = (reason == '') and 1 or 0
for i = 1, n do
  local level, ts, cost, cap, rate = unpack(levels[i])
  if ok == 1 then
    level = level - cost
    redis.call('HSET', KEYS[i + 1], 'level', tostring(level), 'ts', tostring(ts))
    redis.call('PEXPIRE', KEYS[i + 1], math.ceil((cap - level) / rate) + 60000)
  end
  out[#out + 1] = tostring(level)
  out[#out + 1] = math.ceil((cap - level) / rate)
end
if ok == 1 and max_conc > 0 then
  redis.call('ZADD', KEYS[1], now + lease, id)
  redis.call('PEXPIRE', KEYS[1], lease + 60000)
end
return {ok, wait, reason, unpack(out)}
"""

# KEYS[1] = concurrency zset, KEYS[2..] = buckets; ARGV: request_id, then per bucket: capacity, refund
RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
for i = 1, #KEYS - 1 do
  local cap, refund = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local level = tonumber(redis.call('HGET', KEYS[i + 1], 'level'))
  if level and refund > 0 then
    redis.call('HSET', KEYS[i + 1], 'level', tostring(math.min(cap, level + refund)))
  end
end
return 1
"""


@dataclass(frozen=True)
class BucketState:
    modality: str
    limit: float  # per minute
    capacity: float  # burst
    remaining: float
    reset_s: float  # until full again


@dataclass(frozen=True)
class AdmitResult:
    ok: bool
    # Seconds until the request could pass; None when it never can (costs more than a minute's budget).
    retry_after_s: float | None
    reason: str  # "" | "bucket" | "concurrency"
    buckets: list[BucketState]


class Buckets:
    def __init__(self, redis, prefix: str = "omniray:quota"):
        self.redis, self.prefix = redis, prefix
        self._admit = redis.register_script(ADMIT)
        self._release = redis.register_script(RELEASE)

    def _keys(self, tenant: str, modalities: list[str]) -> list[str]:
        return [f"{self.prefix}:{tenant}:concurrency"] + [f"{self.prefix}:{tenant}:{m}" for m in modalities]

    async def admit(
        self,
        tenant: str,
        request_id: str,
        costs: dict[str, tuple[float, float, float]],  # modality -> (per-minute budget, capacity, cost)
        max_concurrent: int | None = None,
        lease_s: float = 900.0,
        now_ms: int | None = None,
    ) -> AdmitResult:
        modalities = list(costs)
        args: list = ["" if now_ms is None else now_ms, request_id, max_concurrent or 0, int(lease_s * 1000)]
        for m in modalities:
            args += list(costs[m])
        raw = await self._admit(keys=self._keys(tenant, modalities), args=args)
        ok, wait_ms, reason = int(raw[0]), int(raw[1]), _str(raw[2])
        states = [
            BucketState(m, costs[m][0], costs[m][1], float(_str(raw[3 + 2 * i])), int(raw[4 + 2 * i]) / 1000)
            for i, m in enumerate(modalities)
        ]
        return AdmitResult(bool(ok), None if wait_ms < 0 else wait_ms / 1000, reason, states)

    async def release(self, tenant: str, request_id: str, refunds: dict[str, tuple[float, float]]) -> None:
        """End a lease and give back what was debited but not used (capacity, refund) per modality."""
        modalities = list(refunds)
        args: list = [request_id]
        for m in modalities:
            args += list(refunds[m])
        await self._release(keys=self._keys(tenant, modalities), args=args)


def _str(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
