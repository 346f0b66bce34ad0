"""The engine's KV block pool occupancy as omniray_kv_pool_occupancy_ratio{tier="engine"}: vLLM's
own KV cache usage of the engine, the leading indicator of session overload (it climbs toward 1
before frames turn late and requests are preempted). A vLLM stat logger in the engine's front end
(the Serve replica); the value goes where the KV store's metrics go (kv_store/connector/connector.py:
running totals and Ray's metrics), with or without the store's connector."""

from __future__ import annotations

from vllm.v1.metrics.loggers import StatLoggerBase

from kv_store.connector import connector

TIER = "engine"


def key() -> str:
    """Where the value lands in connector.TOTALS."""
    return "omniray_kv_pool_occupancy_ratio{" + TIER + "}"


class PoolOccupancy(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0):
        self.engine_index = engine_index

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if scheduler_stats is not None:
            connector.publish({"occupancy": [([TIER], [scheduler_stats.kv_cache_usage])]})

    def log_engine_initialized(self):
        pass
