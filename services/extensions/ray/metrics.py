"""The catalog's metrics (services/common/metric_catalog.py) as Ray metrics, one object per process
and name, exported by Ray's Prometheus endpoint (which prefixes names with `ray_`).

A metric the catalog declares `at_zero` has its series exported at 0 when it is made, so dashboards
and alerts see them in a healthy run: the code that makes it names its label values
(`metric(name, outcome=OUTCOMES, stage="decode")`: a tuple for each of its values). Ray 2.60's
public `Counter.inc` refuses 0; `_record` is what `inc` calls (written for Ray 2.60;
tests/contracts/test_ray_internals.py checks Ray takes it)."""

from __future__ import annotations

import itertools
import threading
import time

from services.common.metric_catalog import CATALOG

GAUGE_REFRESH_S = 5.0  # Ray's agent keeps a gauge 2 export intervals (10 s each by default)
_metrics: dict[str, object] = {}
_at_zero: set[tuple[str, tuple[str, ...]]] = set()  # the series made at 0 in this process
_lock = threading.Lock()


class Gauge:
    """A Ray Gauge that re-sends its last value per label set every GAUGE_REFRESH_S. Ray 2.60's
    metrics agent drops a gauge series that was not reported for two export intervals, so a value
    set once and still true (open sessions, a pool's occupancy) would vanish from Prometheus."""

    _live: list[Gauge] = []
    _lock = threading.Lock()
    _refresher: threading.Thread | None = None

    def __init__(self, name: str, description: str, tag_keys: tuple[str, ...] = ()):
        from ray.util import metrics

        self._gauge = metrics.Gauge(name, description=description, tag_keys=tag_keys)
        self._values: dict[tuple[tuple[str, str], ...], float] = {}
        with Gauge._lock:
            Gauge._live.append(self)
            if Gauge._refresher is None:
                Gauge._refresher = threading.Thread(target=Gauge._refresh_forever, daemon=True)
                Gauge._refresher.start()

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._values[tuple(sorted((tags or {}).items()))] = value
        self._gauge.set(value, tags=tags)

    @classmethod
    def _refresh_forever(cls) -> None:
        while True:
            time.sleep(GAUGE_REFRESH_S)
            with cls._lock:
                live = list(cls._live)
            for gauge in live:
                for key, value in list(gauge._values.items()):
                    gauge._gauge.set(value, tags=dict(key))


def metric(name: str, **values: str | tuple[str, ...]):
    """The Ray metric `name` as the catalog declares it: a Counter, a Histogram, or a Gauge that
    keeps its series alive. `values`: an `at_zero` metric's label values, each a value or a tuple
    of them; every combination not yet exported in this process is exported at 0."""
    from ray.util import metrics as ray_metrics

    m = CATALOG[name]
    if bool(values) and not m.at_zero or m.at_zero and set(values) != set(m.labels):
        raise ValueError(f"{name}: label values are given exactly for a metric exported at zero ({m.labels})")
    with _lock:
        if name not in _metrics:
            if m.kind == "gauge":
                _metrics[name] = Gauge(m.name, description=m.help, tag_keys=m.labels)
            elif m.kind == "counter":
                _metrics[name] = ray_metrics.Counter(m.name, description=m.help, tag_keys=m.labels)
            else:
                _metrics[name] = ray_metrics.Histogram(
                    m.name, description=m.help, boundaries=list(m.buckets), tag_keys=m.labels
                )
        made = _metrics[name]
        if m.at_zero:
            given = [
                values[label] if isinstance(values[label], tuple) else (values[label],) for label in m.labels
            ]
            for combination in itertools.product(*given):
                if (name, combination) not in _at_zero:
                    _at_zero.add((name, combination))
                    tags = dict(zip(m.labels, combination, strict=True))
                    if m.kind == "gauge":
                        made.set(0, tags=tags)
                    else:
                        zero(made, **tags)
        return made


def zero(counter, **tags: str) -> None:
    """A counter series at 0 (the engine's replayed counters; `metric` for the catalog's own)."""
    counter._record(0, tags=tags)
