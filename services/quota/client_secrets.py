"""Ephemeral client secrets (OpenAI's `POST /v1/realtime/client_secrets`): a tenant's server mints a
short-lived token for a browser, so the page never holds the tenant's API key.

A secret opens one realtime session (WebSocket or WebRTC), on any gateway replica: it is kept in
Redis under its sha256 digest (never in the clear) with its lifetime as the key's TTL, and redeeming
takes it out in the same step (GETDEL), so a second use — or a use after it expired — finds nothing.
It names its tenant (looked up again when redeemed: a tenant removed meanwhile opens nothing) and
carries the session settings fixed at minting.

A tenant holds at most `RealtimeLimits.max_client_secrets` secrets outstanding (minted, neither used
nor expired): each may keep up to 256 KiB of settings in Redis for two hours, so a leaked key or a
runaway loop must not fill Redis. They are counted in a sorted set per tenant (digest by expiry),
trimmed, checked and added to in one script with the secret itself."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

from services.quota.tenants import TenantSpec, key_digest

PREFIX = "ek_"  # how a client secret is told from an API key
REDIS_SECRET = "omniray:client_secret:{}"  # sha256(secret) -> JSON {tenant_id, session, expires_at}
REDIS_OUTSTANDING = "omniray:client_secrets:"  # + tenant id -> sorted set: digest by expiry (unix s)
# OpenAI's bounds and default for `expires_after.seconds`.
MIN_TTL_S, MAX_TTL_S, DEFAULT_TTL_S = 10, 7200, 600

# KEYS: the secret, the tenant's outstanding set. ARGV: record, ttl_s, expires_at, digest, cap (0:
# none), now. {1} minted, or {0, the earliest expiry} when the tenant is at its cap.
MINT = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[6])
local cap = tonumber(ARGV[5])
if cap > 0 and redis.call('ZCARD', KEYS[2]) >= cap then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {0, first[2]}
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
if redis.call('TTL', KEYS[2]) < tonumber(ARGV[2]) then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
return {1}
"""
# KEYS: the secret. ARGV: its digest, REDIS_OUTSTANDING. The record, taken out and no longer counted
# against its tenant; nil when there is none. The tenant's set is named from the record, in the
# script: one Redis, not a cluster.
REDEEM = """
local raw = redis.call('GETDEL', KEYS[1])
if not raw then return false end
redis.call('ZREM', ARGV[2] .. cjson.decode(raw)['tenant_id'], ARGV[1])
return raw
"""


def is_client_secret(key: str | None) -> bool:
    return bool(key) and key.startswith(PREFIX)


@dataclass(frozen=True)
class Redeemed:
    tenant_id: str
    session: dict  # settings the session starts with (validated when minted)


class AtCap(Exception):
    """The tenant has its cap of secrets outstanding; one more may be minted at `free_at` (unix s)."""

    def __init__(self, outstanding: int, free_at: float):
        super().__init__(outstanding, free_at)
        self.outstanding, self.free_at = outstanding, free_at


class ClientSecrets:
    def __init__(self, redis):
        self.redis = redis
        self._mint = redis.register_script(MINT)
        self._redeem = redis.register_script(REDEEM)

    async def mint(self, tenant: TenantSpec, session: dict, ttl_s: int) -> tuple[str, int]:
        """A new secret and when it expires (unix seconds); AtCap when the tenant holds its cap."""
        value = PREFIX + secrets.token_urlsafe(32)
        digest, now = key_digest(value), time.time()
        expires_at = int(now) + ttl_s
        record = {"tenant_id": tenant.id, "session": session, "expires_at": expires_at}
        cap = tenant.realtime.max_client_secrets or 0
        keys = [REDIS_SECRET.format(digest), REDIS_OUTSTANDING + tenant.id]
        result = await self._mint(keys=keys, args=[json.dumps(record), ttl_s, expires_at, digest, cap, now])
        if not int(result[0]):
            raise AtCap(cap, float(result[1]))
        return value, expires_at

    async def redeem(self, value: str) -> Redeemed | None:
        """The secret's tenant id and settings, once; None when unknown, used or expired."""
        digest = key_digest(value)
        raw = await self._redeem(keys=[REDIS_SECRET.format(digest)], args=[digest, REDIS_OUTSTANDING])
        if raw is None:
            return None
        record = json.loads(raw)
        if record["expires_at"] <= time.time():  # Redis expires keys lazily to the second
            return None
        return Redeemed(record["tenant_id"], record["session"])
