"""Ephemeral client secrets (OpenAI's `POST /v1/realtime/client_secrets`): a tenant's server mints a
short-lived token for a browser, so the page never holds the tenant's API key.

A secret opens one realtime session (WebSocket or WebRTC), on any gateway replica: it is kept in
Redis under its sha256 digest (never in the clear) with its lifetime as the key's TTL, and redeeming
takes it out in the same step (GETDEL), so a second use — or a use after it expired — finds nothing.
It names its tenant (looked up again when redeemed: a tenant removed meanwhile opens nothing) and
carries the session settings fixed at minting."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

from services.quota.tenants import TenantSpec, key_digest

PREFIX = "ek_"  # how a client secret is told from an API key
REDIS_SECRET = "omniray:client_secret:{}"  # sha256(secret) -> JSON {tenant_id, session, expires_at}
# OpenAI's bounds and default for `expires_after.seconds`.
MIN_TTL_S, MAX_TTL_S, DEFAULT_TTL_S = 10, 7200, 600


def is_client_secret(key: str | None) -> bool:
    return bool(key) and key.startswith(PREFIX)


@dataclass(frozen=True)
class Redeemed:
    tenant_id: str
    session: dict  # settings the session starts with (validated when minted)


class ClientSecrets:
    def __init__(self, redis):
        self.redis = redis

    async def mint(self, tenant: TenantSpec, session: dict, ttl_s: int) -> tuple[str, int]:
        """A new secret and when it expires (unix seconds)."""
        value = PREFIX + secrets.token_urlsafe(32)
        expires_at = int(time.time()) + ttl_s
        record = {"tenant_id": tenant.id, "session": session, "expires_at": expires_at}
        await self.redis.set(REDIS_SECRET.format(key_digest(value)), json.dumps(record), ex=ttl_s)
        return value, expires_at

    async def redeem(self, value: str) -> Redeemed | None:
        """The secret's tenant id and settings, once; None when unknown, used or expired."""
        raw = await self.redis.getdel(REDIS_SECRET.format(key_digest(value)))
        if raw is None:
            return None
        record = json.loads(raw)
        if record["expires_at"] <= time.time():  # Redis expires keys lazily to the second
            return None
        return Redeemed(record["tenant_id"], record["session"])
