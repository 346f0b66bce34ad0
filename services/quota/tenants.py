"""Tenants and API keys: from a YAML file (hot-reloaded when it changes) and from Redis (added at
run time by an operator), the file winning on a conflict.

API keys are stored and compared as sha256 digests, never in the clear in Redis.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

SloClass = Literal["realtime", "interactive", "batch", "bulk"]
# Higher first: the order the router and the quota service rank classes in.
SLO_CLASSES: tuple[SloClass, ...] = ("realtime", "interactive", "batch", "bulk")
MODALITIES = ("text_tokens", "image_tiles", "audio_seconds", "document_pages", "encoder_gflops")
REDIS_TENANT = "omniray:tenant:{}"  # JSON TenantSpec
REDIS_KEY = "omniray:apikey:{}"  # sha256(api key) -> tenant id


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Limits(_Strict):
    """Per-minute budgets; None means unlimited."""

    text_tokens: float | None = None
    image_tiles: float | None = None
    audio_seconds: float | None = None
    document_pages: float | None = None
    encoder_gflops: float | None = None


class TenantSpec(_Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    # sha256 hex digests of the tenant's API keys (`python -m services.quota.tenants hash KEY`).
    api_key_sha256: list[str] = Field(default_factory=list)
    per_minute: Limits = Field(default_factory=Limits)
    max_concurrent: int | None = Field(default=None, ge=1)
    # A bucket holds this many seconds of budget: how far a tenant can burst above its rate. A single
    # request bigger than that is refused (429 request_exceeds_quota).
    burst_s: float = Field(default=10.0, gt=0, le=60)
    default_class: SloClass = "interactive"
    # The highest class this tenant may ask for (x-omniray-slo-class / service_tier).
    max_class: SloClass = "interactive"
    # Over-budget batch/bulk requests wait here (per gateway replica) before a 429.
    batch_queue: int = Field(default=32, ge=0)
    batch_max_wait_s: float = Field(default=120.0, gt=0)


class TenantsFile(_Strict):
    tenants: list[TenantSpec]


def key_digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class Tenants:
    """Resolves an API key to its tenant. The file is re-read when its mtime changes (checked at
    most every `reload_s`); Redis entries are cached for `reload_s`."""

    def __init__(self, path: Path | None, redis=None, reload_s: float = 2.0):
        self.path, self.redis, self.reload_s = path, redis, reload_s
        self._mtime = -1.0
        self._checked = 0.0
        self._by_digest: dict[str, TenantSpec] = {}
        self._by_id: dict[str, TenantSpec] = {}
        self._redis_cache: dict[str, tuple[float, TenantSpec | None]] = {}
        self._reload(force=True)

    def _reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self.reload_s:
            return
        self._checked = now
        if self.path is None:
            return
        mtime = os.stat(self.path).st_mtime
        if mtime == self._mtime:
            return
        spec = TenantsFile.model_validate(yaml.safe_load(self.path.read_text()) or {"tenants": []})
        self._by_id = {t.id: t for t in spec.tenants}
        self._by_digest = {d: t for t in spec.tenants for d in t.api_key_sha256}
        self._mtime = mtime

    async def resolve(self, api_key: str | None) -> TenantSpec | None:
        if not api_key:
            return None
        self._reload()
        digest = key_digest(api_key)
        if (tenant := self._by_digest.get(digest)) is not None:
            return tenant
        if self.redis is None:
            return None
        cached = self._redis_cache.get(digest)
        if cached and time.monotonic() - cached[0] < self.reload_s:
            return cached[1]
        tenant = None
        if (tenant_id := await self.redis.get(REDIS_KEY.format(digest))) is not None:
            tenant_id = tenant_id.decode() if isinstance(tenant_id, bytes) else tenant_id
            tenant = self._by_id.get(tenant_id)
            if tenant is None and (raw := await self.redis.get(REDIS_TENANT.format(tenant_id))):
                tenant = TenantSpec.model_validate(json.loads(raw))
        self._redis_cache[digest] = (time.monotonic(), tenant)
        return tenant


async def put_tenant(redis, tenant: TenantSpec, api_keys: list[str] = ()) -> None:
    """Register a tenant and keys in Redis (operators; tests)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(REDIS_TENANT.format(tenant.id), tenant.model_dump_json())
        for key in api_keys:
            pipe.set(REDIS_KEY.format(key_digest(key)), tenant.id)
        await pipe.execute()


def main() -> None:
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "hash":
        print(key_digest(sys.argv[2]))
    else:
        sys.exit("usage: python -m services.quota.tenants hash API_KEY")


if __name__ == "__main__":
    main()
