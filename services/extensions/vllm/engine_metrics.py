"""The engine processes' metrics, as the engine's front end (the Serve replica that owns the engine)
exports them.

The engine-core process is not a Ray worker: the KV store's connector and omniray's scheduler record
there (kv_store.metrics.Recorder) and their recordings reach the front end with vLLM's scheduler
stats: the scheduler's under `ENGINE_KEY` in `SchedulerStats.kv_connector_stats` (attach(), popped
by the stat logger before vLLM's own loggers read that dict; present with or without a KV
connector), the store's as the connector's own stats. Here they are replayed into running totals
(TOTALS: read by the stage for tests and health) and Ray's metrics.
"""

from __future__ import annotations

from typing import Any

from kv_store import metrics as store_metrics
from services.common.metric_catalog import CATALOG
from services.extensions.ray.metrics import metric, zero

# The scheduler's metrics (services/extensions/vllm/scheduler.py), recorded in the engine core; their
# names, labels and buckets are declared in services/common/metric_catalog.py.
ENGINE_SPEC: store_metrics.Spec = {
    method: (
        "histogram" if method in ("decision", "frame") else "counter",
        name,
        CATALOG[name].help,
        CATALOG[name].labels,
    )
    for method, name in (
        ("decision", "omniray_scheduler_decision_seconds"),
        ("frame", "omniray_scheduler_frame_seconds"),
        ("ranked", "omniray_scheduler_ranked_total"),
        ("yielded", "omniray_scheduler_yielded_total"),
        ("reordered", "omniray_scheduler_kv_blocks_reordered_total"),
        ("fault", "omniray_scheduler_urgency_faults_total"),
        ("preempted", "omniray_scheduler_preemptions_total"),
        ("prompt_computed", "omniray_scheduler_prompt_tokens_computed_total"),
        ("feature_waits", "omniray_scheduler_streamed_feature_waits_total"),
        ("feature_wait_s", "omniray_scheduler_streamed_feature_wait_seconds_total"),
    )
}
SPEC: store_metrics.Spec = {**store_metrics.SPEC, **ENGINE_SPEC}
ENGINE_ZERO_AT_START = {
    "preempted": [("U0",), ("U1",)],
    "fault": [()],
    "yielded": [()],
    "reordered": [("tail",), ("head",)],
    "feature_waits": [("arrived",), ("timed_out",)],
    "feature_wait_s": [("arrived",), ("timed_out",)],
}
ENGINE_KEY = "omniray_engine"


class RayMetrics(store_metrics._Calls):
    """Ray metrics (the serving process's sink) for every engine-process metric."""

    def __init__(self):
        self._metrics = {
            method: (kind, metric(name), labels) for method, (kind, name, _, labels) in SPEC.items()
        }
        # Failures, prefetches, preemptions and urgency faults may not happen for a long while: their series exist
        # at 0 so dashboards and alerts see a healthy store.
        for method, label_sets in {**store_metrics.ZERO_AT_START, **ENGINE_ZERO_AT_START}.items():
            _, m, names = self._metrics[method]
            for labels in label_sets:
                zero(m, **dict(zip(names, labels, strict=True)))

    def record(self, method: str, labels: tuple[str, ...], value: float) -> None:
        kind, m, names = self._metrics[method]
        tags = dict(zip(names, labels, strict=True))
        if kind == "gauge":
            m.set(value, tags=tags)
        elif kind == "counter":
            if value:
                m.inc(value, tags=tags)
            else:  # a 0 (see KvStore's evictions) creates the series
                zero(m, **tags)
        else:
            m.observe(value, tags=tags)


# The front end's running totals (readable by the stage that owns the engine) and Ray export.
TOTALS = store_metrics.Totals(SPEC)
_RAY_METRICS: RayMetrics | None = None


def publish(drained: dict[str, Any]) -> None:
    """Recorded values (Recorder.drain's form) into the totals and, in a Ray worker, Ray's metrics."""
    global _RAY_METRICS
    store_metrics.replay(drained, TOTALS)
    import ray

    if ray.is_initialized():
        _RAY_METRICS = _RAY_METRICS or RayMetrics()
        store_metrics.replay(drained, _RAY_METRICS)


def attach(stats: Any, drained: dict[str, Any]) -> None:
    """Engine core: the scheduler's recording rides `stats` (vLLM's SchedulerStats) to the front end."""
    if drained:
        stats.kv_connector_stats = {**(stats.kv_connector_stats or {}), ENGINE_KEY: drained}


def detach(stats: Any) -> dict[str, Any]:
    """Front end: take the scheduler's recording out of `stats` before vLLM's loggers read it."""
    carried = stats.kv_connector_stats
    if not carried or ENGINE_KEY not in carried:
        return {}
    rest = {k: v for k, v in carried.items() if k != ENGINE_KEY}
    stats.kv_connector_stats = rest or None
    return carried[ENGINE_KEY]
