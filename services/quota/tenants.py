"""Tenants and API keys: from a YAML file (hot-reloaded when it changes) and from Redis (added at
run time by an operator), the file winning on a conflict.

API keys are stored and compared as sha256 digests, never in the clear in Redis. Keys found in the
file never touch Redis, so they keep working while Redis is down. A reload that finds the file
malformed keeps the tenants of the last good one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SloClass = Literal["realtime", "interactive", "batch", "bulk"]
# Higher first: the order the router and the quota service rank classes in.
SLO_CLASSES: tuple[SloClass, ...] = ("realtime", "interactive", "batch", "bulk")
MODALITIES = (
    "text_tokens",
    "image_tiles",
    "audio_seconds",
    "video_seconds",
    "document_pages",
    "encoder_gflops",
)
REDIS_TENANT = "omniray:tenant:{}"  # JSON TenantSpec
REDIS_KEY = "omniray:apikey:{}"  # sha256(api key) -> tenant id
# Keys looked up in Redis (found or not) are remembered this many at most: a flood of random keys
# costs one Redis GET each and a bounded amount of memory.
KEY_CACHE_ENTRIES = 10_000
GONE = -2.0  # the mtime of a tenants file that cannot be found
log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Limits(_Strict):
    """Per-minute budgets; None means unlimited."""

    text_tokens: float | None = None
    image_tiles: float | None = None
    audio_seconds: float | None = None
    video_seconds: float | None = None  # seconds of video clips (their frames also cost image_tiles)
    document_pages: float | None = None
    encoder_gflops: float | None = None


class RealtimeLimits(_Strict):
    """Caps on a tenant's realtime voice sessions, across all gateway replicas; None: none."""

    max_sessions: int | None = Field(default=None, ge=1)  # open at once
    # Seconds of committed user audio per minute, all sessions together; the bucket holds one
    # minute of it (a turn longer than that is refused).
    audio_seconds_per_minute: float | None = Field(default=None, gt=0)
    # Client secrets outstanding at once (minted, neither used nor expired): each keeps up to 256 KiB
    # in Redis for up to two hours. Bounded by default; None: no cap.
    max_client_secrets: int | None = Field(default=1000, ge=1)


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
    realtime: RealtimeLimits = Field(default_factory=RealtimeLimits)
    # Redis unreachable: admit without debiting (counted) instead of a 503. For paid realtime
    # traffic that must not drop while the quota store recovers; off (fail closed) by default.
    fail_open: bool = False


class TenantsFile(_Strict):
    tenants: list[TenantSpec]


def key_digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """At most `max_entries` values, each readable for `ttl_s` after it was put. Entries expire in
    insertion order (one TTL for all), so the oldest is both the first to expire and the one a full
    cache drops: every operation is O(1) amortised."""

    def __init__(self, max_entries: int, ttl_s: float):
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, now: float) -> tuple[bool, V | None]:
        """(True, value) while `key` is fresh, else (False, None)."""
        entry = self._entries.get(key)
        if entry is None or now - entry[0] >= self.ttl_s:
            return False, None
        return True, entry[1]

    def put(self, key: K, value: V, now: float) -> None:
        self._entries.pop(key, None)
        while self._entries:  # expired ones first, then the oldest while full
            oldest = next(iter(self._entries.values()))[0]
            if now - oldest < self.ttl_s and len(self._entries) < self.max_entries:
                break
            self._entries.popitem(last=False)
        self._entries[key] = (now, value)


class ReloadMetrics(Protocol):
    def tenants_reload_failed(self) -> None: ...


class Tenants:
    """Resolves an API key to its tenant. The file is re-read when its mtime changes (checked at
    most every `reload_s`); Redis answers (a tenant or none) are cached for `reload_s`."""

    def __init__(
        self,
        path: Path | None,
        redis=None,
        reload_s: float = 2.0,
        metrics: ReloadMetrics | None = None,
    ):
        self.path, self.redis, self.reload_s, self.metrics = path, redis, reload_s, metrics
        self._mtime = -1.0
        self._checked = 0.0
        self._by_digest: dict[str, TenantSpec] = {}
        self._by_id: dict[str, TenantSpec] = {}
        self._redis_cache: TtlCache[str, TenantSpec | None] = TtlCache(KEY_CACHE_ENTRIES, reload_s)
        if path is not None:  # a gateway that cannot read its tenants at start does not start
            self._load(os.stat(path).st_mtime)

    def _load(self, mtime: float) -> None:
        self._mtime = mtime  # set first: a malformed version is reported once, not every check
        spec = TenantsFile.model_validate(yaml.safe_load(self.path.read_text()) or {"tenants": []})
        self._by_id = {t.id: t for t in spec.tenants}
        self._by_digest = {d: t for t in spec.tenants for d in t.api_key_sha256}

    def _reload(self) -> None:
        now = time.monotonic()
        if self.path is None or now - self._checked < self.reload_s:
            return
        self._checked = now
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            mtime = GONE  # reported once (by _load), like a malformed version
        if mtime == self._mtime:
            return
        try:
            self._load(mtime)
        except (OSError, yaml.YAMLError, ValidationError) as e:
            # The file holds key digests: the log names what is wrong and where, never the content.
            log.error("tenants file %s not reloaded, keeping the last good one: %s", self.path, _describe(e))
            if self.metrics:
                self.metrics.tenants_reload_failed()

    async def resolve(self, api_key: str | None) -> TenantSpec | None:
        """The key's tenant, None when there is none; raises redis.ConnectionError/TimeoutError when
        the key is not in the file and Redis cannot say."""
        if not api_key:
            return None
        self._reload()
        digest = key_digest(api_key)
        if (tenant := self._by_digest.get(digest)) is not None:
            return tenant
        if self.redis is None:
            return None
        hit, tenant = self._redis_cache.get(digest, time.monotonic())
        if hit:
            return tenant
        if (tenant_id := await self.redis.get(REDIS_KEY.format(digest))) is not None:
            tenant = await self.by_id(tenant_id.decode() if isinstance(tenant_id, bytes) else tenant_id)
        self._redis_cache.put(digest, tenant, time.monotonic())
        return tenant

    async def by_id(self, tenant_id: str) -> TenantSpec | None:
        """The tenant of this id as it is now (the file's, else one registered in Redis); None when
        there is none; raises as `resolve` when Redis cannot say."""
        self._reload()
        if (tenant := self._by_id.get(tenant_id)) is not None or self.redis is None:
            return tenant
        raw = await self.redis.get(REDIS_TENANT.format(tenant_id))
        return TenantSpec.model_validate(json.loads(raw)) if raw else None


def _describe(e: Exception) -> str:
    """A reload error without the file's text (pydantic and PyYAML messages quote the input)."""
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['type']}" for err in e.errors())
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        return f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(e, OSError):
        return f"{type(e).__name__} (errno {e.errno})"
    return type(e).__name__


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
