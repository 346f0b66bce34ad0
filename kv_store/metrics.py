"""The store's metrics, and how they leave an engine process.

A store inside vLLM's engine-core process cannot talk to Ray's metrics agent (that process is not a
Ray worker). There a `Recorder` accumulates the same calls; the connector ships the accumulated
values with vLLM's KV-connector stats to the engine's front end (a Serve replica), which replays them
into its metrics sink (services/extensions/vllm/engine_metrics.py: Ray metrics, exported as
ray_omniray_kv_*). Every method is (labels..., value). Nothing here imports Ray.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

# metric method -> (kind, Prometheus name, help, label names)
SPEC: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "occupancy": (
        "gauge",
        "omniray_kv_pool_occupancy_ratio",
        "Used share of a tier's page slots (tier engine: the vLLM engine's own KV block pool).",
        ("tier",),
    ),
    "lookup": ("counter", "omniray_kv_lookups_total", "Page lookups by where they were found.", ("result",)),
    "eviction": (
        "counter",
        "omniray_kv_evictions_total",
        "Pages leaving L2, by policy and where they went.",
        ("policy", "to"),
    ),
    "prefetch": (
        "counter",
        "omniray_kv_prefetch_total",
        "Prefetched pages by outcome (hit, done, late, skipped, cancelled; refused: a preload that would not arrive in time or over the in-flight bound).",
        ("outcome",),
    ),
    "moved": ("counter", "omniray_kv_bytes_moved_total", "Page bytes moved, by path.", ("path",)),
    "transfer": (
        "histogram",
        "omniray_kv_transfer_seconds",
        "Time to move one batch of pages, by path.",
        ("path",),
    ),
    "reload": (
        "histogram",
        "omniray_kv_reload_seconds",
        "On-path reload: time a request waits for its pages from the store (fetch and scatter), by kind.",
        ("kind",),
    ),
    "request": (
        "counter",
        "omniray_kv_request_tokens_total",
        "Prompt tokens looked up in the store per request, by kind (pd, session, prefix) and result "
        "(hit: loaded from the store; miss: computed).",
        ("kind", "result"),
    ),
    "error": (
        "counter",
        "omniray_kv_errors_total",
        "Store operations that failed and were skipped (lookup, naming: the prompt is computed; save: a future miss).",
        ("op",),
    ),
    "redis_error": (
        "counter",
        "omniray_kv_redis_errors_total",
        "Metadata calls that found Redis down or stalled, or were refused at once while it cooled "
        "down (kv_store/metadata.py), by operation; the caller skipped the lookup or save.",
        ("op",),
    ),
    "fallback": (
        "counter",
        "omniray_kv_fallback_recompute_total",
        "Requests whose pages could not be loaded (provider dead, transfer failed) and were recomputed.",
        ("reason",),
    ),
}
# The metadata operations (KvMetadata's Redis calls: its Lua scripts and plain commands).
REDIS_OPS = ("match", "publish", "append_chain", "chain", "providers", "address", "advertise", "heartbeat",
             "alive", "declare_dead", "drop", "pin", "unpin", "lock", "unlock", "evict")  # fmt: skip
ZERO_AT_START = {
    "error": [("lookup",), ("naming",), ("save",)],
    "redis_error": [(op,) for op in REDIS_OPS],
    "fallback": [("load_failed",), ("load_error",)],
    "prefetch": [(o,) for o in ("hit", "done", "late", "skipped", "cancelled", "refused")],
}
TRANSFER_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]


class Metrics(Protocol):
    def occupancy(self, tier: str, ratio: float) -> None: ...
    def lookup(self, result: str, n: float = 1) -> None: ...
    def eviction(self, policy: str, to: str, n: float = 1) -> None: ...
    def prefetch(self, outcome: str, n: float = 1) -> None: ...
    def moved(self, path: str, n_bytes: float) -> None: ...
    def transfer(self, path: str, seconds: float) -> None: ...
    def reload(self, kind: str, seconds: float) -> None: ...
    def request(self, kind: str, result: str, tokens: float) -> None: ...
    def error(self, op: str, n: float = 1) -> None: ...
    def redis_error(self, op: str, n: float = 1) -> None: ...
    def fallback(self, reason: str, n: float = 1) -> None: ...


class _Calls:
    """Implements every method of `Metrics` by calling `self.record(method, labels, value)`."""

    def record(self, method: str, labels: tuple[str, ...], value: float) -> None:
        raise NotImplementedError

    def occupancy(self, tier: str, ratio: float) -> None:
        self.record("occupancy", (tier,), ratio)

    def lookup(self, result: str, n: float = 1) -> None:
        self.record("lookup", (result,), n)

    def eviction(self, policy: str, to: str, n: float = 1) -> None:
        self.record("eviction", (policy, to), n)

    def prefetch(self, outcome: str, n: float = 1) -> None:
        self.record("prefetch", (outcome,), n)

    def moved(self, path: str, n_bytes: float) -> None:
        self.record("moved", (path,), n_bytes)

    def transfer(self, path: str, seconds: float) -> None:
        self.record("transfer", (path,), seconds)

    def reload(self, kind: str, seconds: float) -> None:
        self.record("reload", (kind,), seconds)

    def request(self, kind: str, result: str, tokens: float) -> None:
        self.record("request", (kind, result), tokens)

    def error(self, op: str, n: float = 1) -> None:
        self.record("error", (op,), n)

    def redis_error(self, op: str, n: float = 1) -> None:
        self.record("redis_error", (op,), n)

    def fallback(self, reason: str, n: float = 1) -> None:
        self.record("fallback", (reason,), n)


Spec = dict[str, tuple[str, str, str, tuple[str, ...]]]


class Recorder(_Calls):
    """Accumulates calls (counter sums, last gauge values, histogram observations) until drained.
    `spec`: the metrics it records (the store's SPEC by default; other engine-process components
    record theirs the same way)."""

    def __init__(self, spec: Spec = SPEC):
        self.spec = spec
        self._values: dict[str, dict[tuple[str, ...], list[float]]] = defaultdict(lambda: defaultdict(list))

    def record(self, method: str, labels: tuple[str, ...], value: float) -> None:
        kind = self.spec[method][0]
        slot = self._values[method][labels]
        if kind == "counter" and slot:
            slot[0] += value
        elif kind == "gauge":
            slot[:] = [value]
        else:
            slot.append(value)

    def drain(self) -> dict[str, list[tuple[list[str], list[float]]]]:
        """What was recorded since the last drain, as plain (serialisable) data."""
        out = {
            m: [(list(labels), list(vals)) for labels, vals in per.items()] for m, per in self._values.items()
        }
        self._values.clear()
        return out


def merge(a: dict, b: dict, spec: Spec = SPEC) -> dict:
    """Two drained recordings as one (counters add, gauges keep the later value)."""
    out = {m: {tuple(labels): list(vals) for labels, vals in per} for m, per in a.items()}
    for m, per in b.items():
        kind = spec[m][0]
        slots = out.setdefault(m, {})
        for labels, vals in per:
            key = tuple(labels)
            if kind == "counter" and key in slots:
                slots[key] = [slots[key][0] + vals[0]]
            elif kind == "histogram" and key in slots:
                slots[key] = slots[key] + list(vals)
            else:
                slots[key] = list(vals)
    return {m: [(list(k), v) for k, v in per.items()] for m, per in out.items()}


def replay(drained: dict, into: _Calls) -> None:
    for method, per in drained.items():
        for labels, values in per:
            for value in values:
                into.record(method, tuple(labels), value)


class Totals(_Calls):
    """Running totals in the serving process, readable by the stage (tests, health): counters summed,
    gauges last, histograms as (count, sum)."""

    def __init__(self, spec: Spec = SPEC):
        self.spec = spec
        self.values: dict[str, float] = defaultdict(float)

    def record(self, method: str, labels: tuple[str, ...], value: float) -> None:
        kind, name = self.spec[method][:2]
        key = name + "{" + ",".join(labels) + "}"
        if kind == "gauge":
            self.values[key] = value
        elif kind == "counter":
            self.values[key] += value
        else:
            self.values[key + "_count"] += 1
            self.values[key + "_sum"] += value
