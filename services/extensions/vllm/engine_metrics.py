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
from services.common import telemetry
from services.extensions.ray.metrics import zero

# The scheduler's metrics (services/extensions/vllm/scheduler.py), recorded in the engine core.
ENGINE_SPEC: store_metrics.Spec = {
    "decision": (
        "histogram",
        "omniray_scheduler_decision_seconds",
        "Time the scheduler's urgency policy takes per scheduling round (ranking running requests).",
        ("policy",),
    ),
    "ranked": (
        "counter",
        "omniray_scheduler_ranked_total",
        "Running requests ranked per round, by urgency class (U0, U1, U2, held, fcfs).",
        ("urgency",),
    ),
}
SPEC: store_metrics.Spec = {**store_metrics.SPEC, **ENGINE_SPEC}
DECISION_BUCKETS = [0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01]
ENGINE_KEY = "omniray_engine"


class RayMetrics(store_metrics._Calls):
    """Ray metrics (the serving process's sink) for every engine-process metric."""

    def __init__(self):
        from ray.util import metrics

        self._metrics = {}
        for method, (kind, name, help_, labels) in SPEC.items():
            if kind == "gauge":  # re-sent every few seconds: Ray drops a gauge not reported lately
                m = telemetry.Gauge(name, description=help_, tag_keys=labels)
            elif kind == "counter":
                m = metrics.Counter(name, description=help_, tag_keys=labels)
            else:
                buckets = DECISION_BUCKETS if method in ENGINE_SPEC else store_metrics.TRANSFER_BUCKETS
                m = metrics.Histogram(name, description=help_, boundaries=buckets, tag_keys=labels)
            self._metrics[method] = (kind, m, labels)
        # Failures and prefetches may not happen for a long while: their series exist at 0 so
        # dashboards and alerts see a healthy store.
        for method, label_sets in store_metrics.ZERO_AT_START.items():
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
