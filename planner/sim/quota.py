"""Per-tenant, per-modality quotas on the simulated clock: the quota service's own token buckets
(services/quota/buckets.py — the Lua scripts, run by a real Redis) debited with what the pipeline
charges a request (text tokens with its output budget, image tiles), at the simulated time
(`now_ms`). An interactive request over budget is refused (the gateway's 429); a batch one waits
until its bucket has refilled, up to the tenant's `batch_max_wait_s`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import simpy

from services.common.redis_config import async_client
from services.quota.buckets import Buckets
from services.quota.service import Cost, bucket_costs
from services.quota.tenants import TenantSpec


class SimQuota:
    def __init__(self, env: simpy.Environment, redis_url: str, tenant: TenantSpec):
        self.env, self.tenant = env, tenant
        self.loop = asyncio.new_event_loop()
        # a run's own keys: runs never share a bucket
        self.buckets = Buckets(async_client(redis_url), prefix=f"omniray:sim:{uuid.uuid4().hex[:8]}")
        self.stats: Counter = Counter()

    def admit(self, tenant: str, request_id: str, cost: Cost, batch: bool):
        """A simpy process: True once admitted, False when refused."""
        costs = bucket_costs(self.tenant, cost)
        if not costs:
            return True
        start = self.env.now
        while True:
            result = self.loop.run_until_complete(
                self.buckets.admit(
                    tenant, request_id, costs, self.tenant.max_concurrent, now_ms=int(self.env.now * 1000)
                )  # fmt: skip
            )
            if result.ok:
                self.stats["admitted"] += 1
                self.stats["queued_s"] += self.env.now - start
                return True
            waited = self.env.now - start
            if (
                result.retry_after_s is None
                or not batch
                or waited + result.retry_after_s > self.tenant.batch_max_wait_s
            ):
                self.stats["refused"] += 1
                return False
            yield self.env.timeout(max(result.retry_after_s, 0.01))

    def release(self, tenant: str, request_id: str) -> None:
        self.loop.run_until_complete(self.buckets.release(tenant, request_id, {}))

    def close(self) -> None:
        self.loop.run_until_complete(self.buckets.redis.aclose())
        self.loop.close()
