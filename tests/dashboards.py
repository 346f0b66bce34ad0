"""The shipped Grafana dashboards as their PromQL: what the dashboard tests check."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "helm" / "omniray" / "dashboards").glob("*.json"))
# Grafana's variables, as Grafana substitutes them, so the text is plain PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
_SERIES = re.compile(r"\b(ray_[a-z0-9_]+)\b")


def panels(path: Path) -> list[dict]:
    return json.loads(path.read_text())["panels"]


def promql(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def exprs(path: Path) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of a dashboard."""
    return [(p["title"], promql(t["expr"])) for p in panels(path) for t in p["targets"]]


def series_names(expr: str) -> set[str]:
    """Metric names an expression reads, as a scrape shows them (histograms as _bucket/_count)."""
    return set(_SERIES.findall(expr))


# Emitted only where the profile has a realtime decode pool (qwen3-omni): checked on qwen3-omni-tiny's
# deployment (tests/e2e_qwen3_omni), not on tiny's.
REALTIME_POOL_SERIES = {
    "ray_omniray_router_session_seats_total",
    "ray_omniray_realtime_pool_seats",
    "ray_omniray_realtime_pool_refused_total",
}


def all_series_names() -> set[str]:
    return {n for path in DASHBOARDS for _, e in exprs(path) for n in series_names(e)}
