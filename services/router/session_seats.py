"""Seats in a session pool (the realtime decode pool): each live voice session is pinned to one
replica of the pool, and a replica holds at most `cap` sessions — the staff-level design's realtime
tier, where a session's KV stays on its worker and a worker's session count is bounded.

All state is in Redis, so every gateway replica (its realtime hub, which takes a seat when a session
opens; its Serve router, which sends the session's turns to the seat's replica) sees the same seats:

- `<prefix>live`: a sorted set, replica id -> when its registration lapses (ms). A pool replica
  registers itself every few seconds and withdraws when Serve begins draining it; a killed one
  lapses.
- `<prefix>r:<replica>`: a sorted set, session -> when its seat lapses (ms): the replica's seats.
- `<prefix>s:<session>`: the session's replica (its pin), with the seat's lifetime.

A seat lapses unless renewed (the hub renews its sessions' seats; a routed turn renews its own), so
a gateway that dies frees its sessions' seats within one lifetime. Time is the Redis server's own
(`TIME` in the scripts): the processes' clocks do not matter.

Placing a session, in one script: a session whose replica is still live keeps it. Otherwise it gets
the live replica with the fewest seats below the cap: a new session, or one whose replica is gone
(drained or killed) — it migrates, and its KV follows it through the KV store. A new session finds
no seat when every replica is at its cap (the hub refuses it: the autoscaler grows the pool from the
sessions open). An accepted session whose replica went while the others are full is not lost: it
takes the least-held replica over the cap (`overflow`, counted) until the pool grows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Outcome = Literal["kept", "placed", "migrated", "overflow", "full"]
OUTCOMES: tuple[Outcome, ...] = ("kept", "placed", "migrated", "overflow", "full")

# ARGV: prefix, session, cap, seat ttl (ms), "given" or "registered", then the live replicas to choose
# from ("given"). {replica, outcome}; replica is false when there is no seat.
PLACE = """
local prefix, session = ARGV[1], ARGV[2]
local cap, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = {}
if ARGV[5] == 'given' then
  for i = 6, #ARGV do live[#live + 1] = ARGV[i] end
else
  redis.call('ZREMRANGEBYSCORE', prefix .. 'live', '-inf', now)
  live = redis.call('ZRANGE', prefix .. 'live', 0, -1)
end
local pin = prefix .. 's:' .. session
local pinned = redis.call('GET', pin)
local function held(r)
  redis.call('ZREMRANGEBYSCORE', prefix .. 'r:' .. r, '-inf', now)
  return redis.call('ZCARD', prefix .. 'r:' .. r)
end
local function seat(r)
  redis.call('SET', pin, r, 'PX', ttl)
  redis.call('ZADD', prefix .. 'r:' .. r, now + ttl, session)
  redis.call('PEXPIRE', prefix .. 'r:' .. r, ttl)
end
if pinned then
  for _, r in ipairs(live) do
    if r == pinned then seat(r); return {r, 'kept'} end
  end
end
local best, fewest = false, nil
for _, r in ipairs(live) do
  local n = held(r)
  if n < cap and (fewest == nil or n < fewest) then best, fewest = r, n end
end
local outcome = 'placed'
if pinned then outcome = 'migrated' end
if not best then
  if not pinned then return {false, 'full'} end
  for _, r in ipairs(live) do
    local n = held(r)
    if fewest == nil or n < fewest then best, fewest = r, n end
  end
  if not best then return {false, 'full'} end
  outcome = 'overflow'
end
if pinned then redis.call('ZREM', prefix .. 'r:' .. pinned, session) end
seat(best)
return {best, outcome}
"""
# ARGV: prefix, ttl (ms), then sessions. Each seat still held runs another ttl.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local renewed = 0
for i = 3, #ARGV do
  local pin = ARGV[1] .. 's:' .. ARGV[i]
  local r = redis.call('GET', pin)
  if r then
    redis.call('PEXPIRE', pin, ttl)
    redis.call('ZADD', ARGV[1] .. 'r:' .. r, now + ttl, ARGV[i])
    redis.call('PEXPIRE', ARGV[1] .. 'r:' .. r, ttl)
    renewed = renewed + 1
  end
end
return renewed
"""
# ARGV: prefix, session. The seat given back.
RELEASE = """
local pin = ARGV[1] .. 's:' .. ARGV[2]
local r = redis.call('GET', pin)
if r then
  redis.call('ZREM', ARGV[1] .. 'r:' .. r, ARGV[2])
  redis.call('DEL', pin)
end
return r
"""
# ARGV: prefix, replica, ttl (ms; 0: withdraw). The replica's registration, from the server's clock.
REGISTER = """
local key = ARGV[1] .. 'live'
if tonumber(ARGV[3]) == 0 then return redis.call('ZREM', key, ARGV[2]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', key, now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', key, tonumber(ARGV[3]) * 10)
return 1
"""
# ARGV: prefix. {replica, seats held, ...} of the live replicas.
OCCUPANCY = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', ARGV[1] .. 'live', '-inf', now)
local out = {}
for _, r in ipairs(redis.call('ZRANGE', ARGV[1] .. 'live', 0, -1)) do
  redis.call('ZREMRANGEBYSCORE', ARGV[1] .. 'r:' .. r, '-inf', now)
  out[#out + 1] = r
  out[#out + 1] = redis.call('ZCARD', ARGV[1] .. 'r:' .. r)
end
return out
"""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class Placement:
    replica: str | None  # None: no seat (outcome "full")
    outcome: Outcome


class SessionSeats:
    """One pool's seats (`pool`: its deployment's name) through an asyncio Redis client, whose
    timeouts bound every call (services/common/redis_config.py)."""

    def __init__(self, redis, pool: str, cap: int, seat_ttl_s: float):
        if cap < 1 or seat_ttl_s <= 0:
            raise ValueError("a session pool needs cap >= 1 and a positive seat lifetime")
        self.redis, self.cap, self.ttl_ms = redis, cap, int(seat_ttl_s * 1000)
        self.prefix = f"omniray:seats:{pool}:"
        self._place = redis.register_script(PLACE)
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)
        self._register = redis.register_script(REGISTER)
        self._occupancy = redis.register_script(OCCUPANCY)

    async def place(self, session: str, live: list[str] | None = None) -> Placement:
        """The session's seat: kept, or given on one of `live` (default: the registered replicas)."""
        given = ["given", *live] if live is not None else ["registered"]
        replica, outcome = await self._place(args=[self.prefix, session, self.cap, self.ttl_ms, *given])
        return Placement(_text(replica) if replica else None, _text(outcome))

    async def renew(self, sessions: list[str]) -> int:
        """The seats of `sessions` run another lifetime; how many were still held."""
        if not sessions:
            return 0
        return int(await self._renew(args=[self.prefix, self.ttl_ms, *sessions]))

    async def release(self, session: str) -> str | None:
        """The session's seat given back; the replica it was on (None: it held none)."""
        replica = await self._release(args=[self.prefix, session])
        return _text(replica) if replica else None

    async def register(self, replica: str, ttl_s: float) -> None:
        """`replica` takes sessions for the next `ttl_s` (registered again before it lapses)."""
        await self._register(args=[self.prefix, replica, max(1, int(ttl_s * 1000))])

    async def withdraw(self, replica: str) -> None:
        """`replica` takes no more sessions (it drains): its sessions move at their next turn."""
        await self._register(args=[self.prefix, replica, 0])

    async def occupancy(self) -> dict[str, int]:
        """Seats held on each live replica."""
        flat = await self._occupancy(args=[self.prefix])
        return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
