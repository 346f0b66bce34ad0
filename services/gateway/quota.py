"""The quota service of a gateway replica, and its metrics (exported through Ray's metrics agent,
`ray_` prefix). The quota package itself is Ray-free: it reports to whatever sink it is given."""

from __future__ import annotations

import os
from pathlib import Path

from services.common.redis_config import async_client
from services.extensions.ray.metrics import metric
from services.gateway.load_meter import LoadMeter
from services.quota import DEFAULT_TENANTS_FILE
from services.quota.buckets import Buckets
from services.quota.service import QuotaService
from services.quota.tenants import Tenants

# Quota calls that need Redis (the `op` label of omniray_quota_redis_errors_total).
REDIS_OPS = ("authenticate", "admit", "release", "session_open", "session_audio", "session_close",
             "client_secret")  # fmt: skip


class QuotaMetrics:
    def __init__(self, load: LoadMeter | None = None):
        self.load = load
        self._rejections = metric("omniray_quota_rejections_total")
        self._admitted = metric("omniray_quota_admitted_total")
        self._remaining = metric("omniray_quota_bucket_remaining_ratio")
        self._queue = metric("omniray_quota_batch_queue_depth")
        self._wait = metric("omniray_quota_queue_wait_seconds")
        self._redis_errors = metric("omniray_quota_redis_errors_total", op=REDIS_OPS)
        self._unmetered = metric("omniray_quota_unmetered_total")
        self._reload_errors = metric("omniray_quota_tenants_reload_errors_total")

    def rejected(self, tenant: str, modality: str, reason: str, slo_class: str = "none") -> None:
        self._rejections.inc(
            tags={"tenant": tenant, "modality": modality, "reason": reason, "slo_class": slo_class}
        )

    def admitted(self, lease) -> None:
        if self.load is not None:
            self.load.add(lease.cost, lease.realtime)
        self._admitted.inc(tags={"tenant": lease.tenant.id, "slo_class": lease.slo_class})
        self._wait.observe(lease.queued_s, tags={"slo_class": lease.slo_class})
        for modality, ratio in lease.levels.items():
            self._remaining.set(ratio, tags={"tenant": lease.tenant.id, "modality": modality})

    def queue_depth(self, tenant: str, depth: int) -> None:
        self._queue.set(depth, tags={"tenant": tenant})

    def redis_error(self, op: str) -> None:
        self._redis_errors.inc(tags={"op": op})

    def unmetered(self, tenant: str, slo_class: str) -> None:
        self._unmetered.inc(tags={"tenant": tenant, "slo_class": slo_class})

    def tenants_reload_failed(self) -> None:
        self._reload_errors.inc()


def quota_service() -> QuotaService:
    """Tenants from $OMNIRAY_TENANTS_FILE (default configs/tenants/local.yaml) and Redis at
    $OMNIRAY_REDIS_URL (bounded timeouts: a stalled Redis is a 503 within a second, docs/quota.md)."""
    redis = async_client()
    metrics = QuotaMetrics(LoadMeter(redis))
    tenants = Tenants(
        Path(os.environ.get("OMNIRAY_TENANTS_FILE", DEFAULT_TENANTS_FILE)), redis, metrics=metrics
    )
    return QuotaService(tenants, Buckets(redis), metrics)
