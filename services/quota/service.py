"""The quota service: who is calling (API key -> tenant), which SLO class they get, and whether
their per-modality budgets allow the request now.

Over budget, `realtime`/`interactive` requests get a 429 at once; `batch`/`bulk` requests wait in a
bounded per-tenant queue (per gateway replica) until their buckets refill, then a 429 when the
queue is full or the wait too long. Every answer carries `x-ratelimit-*` headers.

Redis down or stalled (every call is bounded by the client's timeouts, services/common/redis_config):
a 503 `quota_unavailable` with `Retry-After` — or, for a tenant with `fail_open`, admission without
a debit (counted). Ending a lease never fails a response: a refund that cannot be written is lost
and the lease expires by itself.

Realtime sessions have caps of their own per tenant (`TenantSpec.realtime`): sessions open at once
(a lease per session, renewed with each audio debit) and committed audio seconds per minute.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

from services.common.errors import OmniError
from services.common.redis_config import UNAVAILABLE
from services.quota.buckets import AdmitResult, Buckets, BucketState
from services.quota.client_secrets import AtCap, ClientSecrets
from services.quota.tenants import MODALITIES, SloClass, Tenants, TenantSpec

log = logging.getLogger(__name__)
# A realtime session holds its slot this long after its last audio debit (or its start): a session
# whose gateway died frees its slot by then.
SESSION_LEASE_S = 900.0
# The bucket of committed realtime audio (its x-ratelimit-* headers say realtime-audio-seconds).
REALTIME_AUDIO = "realtime_audio_seconds"
LOG_EVERY_S = 10.0  # an outage fails every request: one warning per this many seconds, all counted


@dataclass(frozen=True)
class Cost:
    """What one request spends, per budget (MODALITIES)."""

    text_tokens: float = 0.0
    image_tiles: float = 0.0
    audio_seconds: float = 0.0
    video_seconds: float = 0.0
    document_pages: float = 0.0
    encoder_gflops: float = 0.0

    def items(self) -> list[tuple[str, float]]:
        return [(m, getattr(self, m)) for m in MODALITIES]


@dataclass
class Lease:
    tenant: TenantSpec
    request_id: str
    slo_class: SloClass
    cost: Cost
    headers: dict[str, str] = field(default_factory=dict)
    levels: dict[str, float] = field(default_factory=dict)  # remaining / limit per budget
    buckets: list[BucketState] = field(default_factory=list)  # after the admission (rate_limits.updated)
    queued_s: float = 0.0
    # False: nothing in Redis to end — a tenant with no budget and no concurrency cap, or one
    # admitted without a debit while Redis was unreachable (fail_open)
    metered: bool = True
    realtime: bool = False  # a realtime session's turn (the offered load counts those apart)


def bucket_costs(tenant: TenantSpec, cost: Cost) -> dict[str, tuple[float, float, float]]:
    """What `Buckets.admit` debits for `cost`: per metered budget, (per-minute budget, capacity: the
    tenant's burst, cost)."""
    limits = tenant.per_minute
    return {
        m: (getattr(limits, m), getattr(limits, m) * tenant.burst_s / 60, c)
        for m, c in cost.items()
        if getattr(limits, m) is not None
    }


def _fmt_s(seconds: float) -> str:
    return f"{max(0.0, seconds):.3g}s"


def ratelimit_headers(result: AdmitResult) -> dict[str, str]:
    headers = {}
    for b in result.buckets:
        name = b.modality.replace("_", "-")
        headers[f"x-ratelimit-limit-{name}"] = f"{b.limit:g}"
        headers[f"x-ratelimit-remaining-{name}"] = f"{max(0.0, b.remaining):.0f}"
        headers[f"x-ratelimit-reset-{name}"] = _fmt_s(b.reset_s)
    return headers


def unavailable() -> OmniError:
    return OmniError(
        503,
        "the quota service cannot reach its store; retry shortly",
        code="quota_unavailable",
        headers={"retry-after": "1"},
    )


class QuotaService:
    def __init__(self, tenants: Tenants, buckets: Buckets, metrics=None):
        self.tenants, self.buckets, self.metrics = tenants, buckets, metrics
        # Realtime session slots and audio: the same Redis, keys of their own.
        self.realtime = Buckets(buckets.redis, prefix=f"{buckets.prefix}-rt")
        self.secrets = ClientSecrets(buckets.redis)
        self._queued: dict[str, int] = {}
        self._logged_at = -math.inf

    def _redis_failed(self, op: str, error: Exception) -> None:
        if self.metrics:
            self.metrics.redis_error(op)
        if time.monotonic() - self._logged_at >= LOG_EVERY_S:
            self._logged_at = time.monotonic()
            log.warning(
                "quota %s: Redis unreachable (%s); answering 503 (fail_open tenants: unmetered)",
                op,
                type(error).__name__,
            )

    async def authenticate(self, api_key: str | None) -> TenantSpec:
        try:
            tenant = await self.tenants.resolve(api_key)
        except UNAVAILABLE as e:  # a key not in the tenants file, and Redis cannot say whose it is
            self._redis_failed("authenticate", e)
            if self.metrics:
                self.metrics.rejected("unknown", "none", "quota_unavailable")
            raise unavailable() from None
        if tenant is None:
            what = "missing API key" if not api_key else "unknown API key"
            if self.metrics:
                self.metrics.rejected("unknown", "none", "unauthenticated")
            raise OmniError(
                401,
                f"{what}: send `Authorization: Bearer <key>`",
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        return tenant

    async def mint_secret(self, tenant: TenantSpec, session: dict, ttl_s: int) -> tuple[str, int]:
        """A single-use client secret for one realtime session of `tenant` (services/quota/client_secrets.py)."""
        try:
            return await self.secrets.mint(tenant, session, ttl_s)
        except UNAVAILABLE as e:
            self._redis_failed("client_secret", e)
            raise unavailable() from None
        except AtCap as e:
            self._reject(tenant, "none", "client_secrets", "realtime")
            raise OmniError(
                429,
                f"tenant {tenant.id!r} has {e.outstanding} client secrets outstanding (minted, neither used "
                "nor expired), its limit",
                code="rate_limit_exceeded",
                headers={"retry-after": str(max(1, math.ceil(e.free_at - time.time())))},
            ) from None

    async def redeem_secret(self, value: str) -> tuple[TenantSpec, dict]:
        """The tenant (as it is now) and session settings of a client secret, taken out of the
        store; 401 when it is unknown, already used or expired, or its tenant is gone."""
        try:
            redeemed = await self.secrets.redeem(value)
            tenant = None if redeemed is None else await self.tenants.by_id(redeemed.tenant_id)
        except UNAVAILABLE as e:
            self._redis_failed("client_secret", e)
            raise unavailable() from None
        if tenant is None:
            if self.metrics:
                self.metrics.rejected("unknown", "none", "unauthenticated")
            raise OmniError(
                401,
                "client secret unknown, already used or expired: mint a new one",
                code="invalid_client_secret",
                headers={"www-authenticate": "Bearer"},
            )
        return tenant, redeemed.session

    async def admit(
        self, tenant: TenantSpec, request_id: str, cost: Cost, slo_class: SloClass, *, realtime: bool = False
    ) -> Lease:
        costs = bucket_costs(tenant, cost)
        start = time.monotonic()
        if not costs and tenant.max_concurrent is None:  # nothing to count: no Redis round trip
            lease = Lease(tenant, request_id, slo_class, cost, metered=False, realtime=realtime)
            if self.metrics:
                self.metrics.admitted(lease)
            return lease
        queued = False
        try:
            while True:
                try:
                    result = await self.buckets.admit(tenant.id, request_id, costs, tenant.max_concurrent)
                except UNAVAILABLE as e:
                    self._redis_failed("admit", e)
                    return self._unmetered(tenant, request_id, cost, slo_class, start)
                if result.ok:
                    lease = Lease(
                        tenant,
                        request_id,
                        slo_class,
                        cost,
                        headers=ratelimit_headers(result),
                        levels={b.modality: max(0.0, b.remaining) / b.capacity for b in result.buckets},
                        buckets=list(result.buckets),
                        queued_s=time.monotonic() - start,
                        realtime=realtime,
                    )
                    if self.metrics:
                        self.metrics.admitted(lease)
                    return lease
                if result.retry_after_s is None:
                    worst = max(costs, key=lambda m: costs[m][2] / costs[m][1])
                    self._reject(tenant, worst, "exceeds_limit", slo_class)
                    raise OmniError(
                        429,
                        f"this request needs {costs[worst][2]:g} {worst.replace('_', ' ')}, more than tenant "
                        f"{tenant.id!r} may burst ({costs[worst][1]:g}: {tenant.burst_s:g}s of its "
                        f"{costs[worst][0]:g}/min)",
                        code="request_exceeds_quota",
                        headers=ratelimit_headers(result),
                    )
                waited = time.monotonic() - start
                if (
                    slo_class in ("realtime", "interactive")
                    or waited + result.retry_after_s > tenant.batch_max_wait_s
                ):
                    raise self._over_budget(tenant, result, slo_class, "over_budget")
                if not queued:
                    if self._queued.get(tenant.id, 0) >= tenant.batch_queue:
                        raise self._over_budget(tenant, result, slo_class, "queue_full")
                    self._queued[tenant.id] = self._queued.get(tenant.id, 0) + 1
                    queued = True
                    if self.metrics:
                        self.metrics.queue_depth(tenant.id, self._queued[tenant.id])
                await asyncio.sleep(min(max(result.retry_after_s, 0.01), 1.0))
        finally:
            if queued:
                self._queued[tenant.id] -= 1
                if self.metrics:
                    self.metrics.queue_depth(tenant.id, self._queued[tenant.id])

    def _unmetered(
        self, tenant: TenantSpec, request_id: str, cost: Cost, slo_class: SloClass, start: float
    ) -> Lease:
        """Redis is unreachable: a 503, or for a fail_open tenant a lease that debited nothing."""
        if not tenant.fail_open:
            self._reject(tenant, "none", "quota_unavailable", slo_class)
            raise unavailable()
        if self.metrics:
            self.metrics.unmetered(tenant.id, slo_class)
        return Lease(tenant, request_id, slo_class, cost, queued_s=time.monotonic() - start, metered=False)

    def _over_budget(self, tenant: TenantSpec, result: AdmitResult, slo_class: str, reason: str) -> OmniError:
        if result.reason == "concurrency":
            modality, reason = "none", "concurrency"
            message = f"tenant {tenant.id!r} has {tenant.max_concurrent} requests in flight, its limit"
        else:
            modality = min(result.buckets, key=lambda b: b.remaining / max(b.capacity, 1e-9)).modality
            message = f"tenant {tenant.id!r} is over its {modality.replace('_', ' ')} budget"
        if reason == "queue_full":
            message += "; the batch queue is full"
        self._reject(tenant, modality, reason, slo_class)
        retry = result.retry_after_s or 1.0
        headers = {"retry-after": str(max(1, math.ceil(retry))), **ratelimit_headers(result)}
        return OmniError(
            429, f"{message}; retry after {retry:.2f}s", code="rate_limit_exceeded", headers=headers
        )

    def _reject(self, tenant: TenantSpec, modality: str, reason: str, slo_class: str) -> None:
        if self.metrics:
            self.metrics.rejected(tenant.id, modality, reason, slo_class)

    async def release(self, lease: Lease, used: Cost | None = None) -> None:
        """End the lease; refund what was reserved but not used (e.g. max_tokens not generated).
        Never raises for Redis: the response it ends has been served."""
        if not lease.metered:
            return
        limits = lease.tenant.per_minute
        refunds = {}
        for m, reserved in lease.cost.items():
            limit = getattr(limits, m)
            if limit is not None:
                capacity = limit * lease.tenant.burst_s / 60
                refunds[m] = (capacity, max(0.0, reserved - getattr(used, m)) if used else 0.0)
        try:
            await self.buckets.release(lease.tenant.id, lease.request_id, refunds)
        except UNAVAILABLE as e:  # the refund is lost; the concurrency lease expires by itself
            self._redis_failed("release", e)

    # ---- realtime sessions ----------------------------------------------------------------------

    async def open_session(self, tenant: TenantSpec, session_id: str) -> None:
        """Take one of the tenant's realtime session slots; 429 `session_limit_reached` when all
        are taken. Tenants without a session cap never touch Redis here."""
        if tenant.realtime.max_sessions is None:
            return
        result = await self._realtime(tenant, session_id, {}, "session_open")
        if result is not None and not result.ok:
            raise self._sessions_full(tenant)

    async def spend_session_audio(self, tenant: TenantSpec, session_id: str, seconds: float) -> None:
        """Debit committed user audio from the tenant's realtime audio budget (and renew the
        session's slot); 429 when the budget is spent."""
        limit = tenant.realtime.audio_seconds_per_minute
        if limit is None and tenant.realtime.max_sessions is None:
            return
        costs = {REALTIME_AUDIO: (limit, limit, seconds)} if limit is not None else {}
        result = await self._realtime(tenant, session_id, costs, "session_audio")
        if result is None or result.ok:
            return
        if result.reason == "concurrency":  # its slot lapsed (no audio for SESSION_LEASE_S) and is taken
            raise self._sessions_full(tenant)
        if result.retry_after_s is None:
            self._reject(tenant, REALTIME_AUDIO, "exceeds_limit", "realtime")
            raise OmniError(
                429,
                f"this turn has {seconds:.1f} s of audio, more than tenant {tenant.id!r} may use in a "
                f"minute of realtime audio ({limit:g} s)",
                code="request_exceeds_quota",
                headers=ratelimit_headers(result),
            )
        raise self._over_budget(tenant, result, "realtime", "over_budget")

    def _sessions_full(self, tenant: TenantSpec) -> OmniError:
        self._reject(tenant, "none", "sessions", "realtime")
        return OmniError(
            429,
            f"tenant {tenant.id!r} has {tenant.realtime.max_sessions} realtime sessions open, its limit",
            code="session_limit_reached",
            headers={"retry-after": "1"},
        )

    async def close_session(self, tenant: TenantSpec, session_id: str) -> None:
        """Give the session's slot back; never raises for Redis (the slot then expires by itself)."""
        if tenant.realtime.max_sessions is None:
            return
        try:
            await self.realtime.release(tenant.id, session_id, {})
        except UNAVAILABLE as e:
            self._redis_failed("session_close", e)

    async def _realtime(
        self, tenant: TenantSpec, session_id: str, costs: dict, op: str
    ) -> AdmitResult | None:
        """One atomic check-and-debit of a session's slot and audio; None when Redis is unreachable
        and the tenant fails open (503 when it does not)."""
        try:
            return await self.realtime.admit(
                tenant.id, session_id, costs, tenant.realtime.max_sessions, lease_s=SESSION_LEASE_S
            )
        except UNAVAILABLE as e:
            self._redis_failed(op, e)
            if not tenant.fail_open:
                self._reject(tenant, "none", "quota_unavailable", "realtime")
                raise unavailable() from None
            if self.metrics:
                self.metrics.unmetered(tenant.id, "realtime")
            return None
