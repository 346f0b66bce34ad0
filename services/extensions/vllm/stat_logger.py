"""omniray's vLLM stat logger, in the engine's front end (the Serve replica that owns the engine).
vLLM runs custom stat loggers before its own, on every stats update of the engine core:

- the engine's KV block pool occupancy as omniray_kv_pool_occupancy_ratio{tier="engine"}: vLLM's own
  KV cache usage, the leading indicator of session overload (it climbs toward 1 before frames turn
  late and requests are preempted);
- the scheduler's metrics recorded in the engine core (services/extensions/vllm/engine_metrics.py),
  taken out of the stats and exported — whether or not the engine runs a KV connector.

Written for vLLM 0.32's `StatLoggerBase`; tests/contracts/test_vllm_stat_logger.py drives it.
"""

from __future__ import annotations

from vllm.v1.metrics.loggers import StatLoggerBase

from services.extensions.vllm import engine_metrics, pins

pins.check(__name__)

TIER = "engine"


def occupancy_key() -> str:
    """Where the occupancy lands in engine_metrics.TOTALS."""
    return "omniray_kv_pool_occupancy_ratio{" + TIER + "}"


class EngineStatLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0):
        self.engine_index = engine_index

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if scheduler_stats is None:
            return
        drained = engine_metrics.detach(scheduler_stats)
        drained["occupancy"] = [([TIER], [scheduler_stats.kv_cache_usage])]
        engine_metrics.publish(drained)

    def log_engine_initialized(self):
        pass
