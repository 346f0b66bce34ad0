"""Where the services find their Redis (quota buckets, tenants, KV store metadata)."""

from __future__ import annotations

import os

ENV = "OMNIRAY_REDIS_URL"  # the local runtime sets it for every process it starts


def redis_url() -> str:
    return os.environ.get(ENV, "redis://127.0.0.1:6379/0")
