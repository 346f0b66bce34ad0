"""Per-tenant, per-modality quotas (see docs/quota.md)."""

from __future__ import annotations

import os
from pathlib import Path

from services.models.profile import REPO_ROOT

DEFAULT_TENANTS_FILE = REPO_ROOT / "configs" / "tenants" / "local.yaml"
# The developer key of the `local` tenant in configs/tenants/local.yaml (printed by `make run`).
LOCAL_API_KEY = "sk-omniray-local"


def quota_service():
    """The quota service of a gateway replica: tenants from $OMNIRAY_TENANTS_FILE (default
    configs/tenants/local.yaml) and Redis at $OMNIRAY_REDIS_URL (bounded timeouts: a stalled Redis
    is a 503 within a second, see docs/quota.md)."""
    from services.common.redis_config import async_client
    from services.quota.buckets import Buckets
    from services.quota.metrics import QuotaMetrics
    from services.quota.service import QuotaService
    from services.quota.tenants import Tenants

    redis = async_client()
    metrics = QuotaMetrics()
    tenants = Tenants(
        Path(os.environ.get("OMNIRAY_TENANTS_FILE", DEFAULT_TENANTS_FILE)), redis, metrics=metrics
    )
    return QuotaService(tenants, Buckets(redis), metrics)
