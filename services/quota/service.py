"""The quota service: who is calling (API key -> tenant), which SLO class they get, and whether
their per-modality budgets allow the request now.

Over budget, `realtime`/`interactive` requests get a 429 at once; `batch`/`bulk` requests wait in a
bounded per-tenant queue (per gateway replica) until their buckets refill, then a 429 when the
queue is full or the wait too long. Every answer carries `x-ratelimit-*` headers.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from services.common.errors import OmniError
from services.quota.buckets import AdmitResult, Buckets
from services.quota.tenants import MODALITIES, SloClass, Tenants, TenantSpec


@dataclass(frozen=True)
class Cost:
    """What one request spends, per budget (MODALITIES)."""

    text_tokens: float = 0.0
    image_tiles: float = 0.0
    audio_seconds: float = 0.0
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
    queued_s: float = 0.0


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


class QuotaService:
    def __init__(self, tenants: Tenants, buckets: Buckets, metrics=None):
        self.tenants, self.buckets, self.metrics = tenants, buckets, metrics
        self._queued: dict[str, int] = {}

    async def authenticate(self, api_key: str | None) -> TenantSpec:
        tenant = await self.tenants.resolve(api_key)
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

    async def admit(self, tenant: TenantSpec, request_id: str, cost: Cost, slo_class: SloClass) -> Lease:
        limits = tenant.per_minute
        costs = {
            m: (getattr(limits, m), getattr(limits, m) * tenant.burst_s / 60, c)
            for m, c in cost.items()
            if getattr(limits, m) is not None
        }
        start = time.monotonic()
        queued = False
        try:
            while True:
                result = await self.buckets.admit(tenant.id, request_id, costs, tenant.max_concurrent)
                if result.ok:
                    lease = Lease(
                        tenant,
                        request_id,
                        slo_class,
                        cost,
                        headers=ratelimit_headers(result),
                        levels={b.modality: max(0.0, b.remaining) / b.capacity for b in result.buckets},
                        queued_s=time.monotonic() - start,
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
        """End the lease; refund what was reserved but not used (e.g. max_tokens not generated)."""
        limits = lease.tenant.per_minute
        refunds = {}
        for m, reserved in lease.cost.items():
            limit = getattr(limits, m)
            if limit is not None:
                capacity = limit * lease.tenant.burst_s / 60
                refunds[m] = (capacity, max(0.0, reserved - getattr(used, m)) if used else 0.0)
        await self.buckets.release(lease.tenant.id, lease.request_id, refunds)
