"""Per-tenant, per-modality quotas (see docs/quota.md)."""

from __future__ import annotations

from services.common.paths import REPO_ROOT

DEFAULT_TENANTS_FILE = REPO_ROOT / "configs" / "tenants" / "local.yaml"
# The developer key of the `local` tenant in configs/tenants/local.yaml (printed by `make run`).
LOCAL_API_KEY = "sk-omniray-local"
