"""Per-tenant, per-modality quotas (see docs/quota.md)."""

from __future__ import annotations

import os
from pathlib import Path

from services.common.redis_config import redis_url
from services.models.profile import REPO_ROOT

DEFAULT_TENANTS_FILE = REPO_ROOT / "configs" / "tenants" / "local.yaml"
# The developer key of the `local` tenant in configs/tenants/local.yaml (printed by `make run`).
LOCAL_API_KEY = "sk-omniray-local"


def quota_service():
    """The quota service of a gateway replica: tenants from $OMNIRAY_TENANTS_FILE (default
    configs/tenants/local.yaml) and Redis at $OMNIRAY_REDIS_URL."""
    import redis.asyncio as aioredis

    from services.quota.buckets import Buckets
    from services.quota.metrics import QuotaMetrics
    from services.quota.service import QuotaService
    from services.quota.tenants import Tenants

    redis = aioredis.Redis.from_url(redis_url())
    tenants = Tenants(Path(os.environ.get("OMNIRAY_TENANTS_FILE", DEFAULT_TENANTS_FILE)), redis)
    return QuotaService(tenants, Buckets(redis), QuotaMetrics())
