"""The catalog's `at_zero` metrics are made with their label values or not at all (a series missing
from a healthy run's dashboard is a bug found at start, not in production); a histogram has no zero
to start at."""

from __future__ import annotations

import pytest

from services.common.metric_catalog import CATALOG, Metric
from services.extensions.ray.metrics import metric


def test_an_at_zero_metric_needs_every_label_value():
    assert CATALOG["omniray_talker_streams_total"].at_zero
    with pytest.raises(ValueError, match="exported at zero"):
        metric("omniray_talker_streams_total")
    with pytest.raises(ValueError, match="exported at zero"):
        metric("omniray_gateway_stage_stalls_total", stage="decode")  # `wait` missing


def test_label_values_are_only_for_at_zero_metrics():
    assert not CATALOG["omniray_gateway_e2e_seconds"].at_zero
    with pytest.raises(ValueError, match="exported at zero"):
        metric("omniray_gateway_e2e_seconds", api="rest")


def test_a_histogram_cannot_start_at_zero():
    with pytest.raises(ValueError, match="histogram"):
        Metric("omniray_x_seconds", "histogram", "x", buckets=(1.0,), at_zero=True)


def test_every_call_that_makes_an_at_zero_metric_names_its_labels():
    """Statically, so a replica does not fail at start: each `metric("name", ...)` in the code names
    every label of an `at_zero` metric (and none of another)."""
    import ast

    from services.common.paths import REPO_ROOT

    wrong = []
    for path in (REPO_ROOT / "services").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            called = getattr(node, "func", None)
            if not (
                isinstance(node, ast.Call) and getattr(called, "id", getattr(called, "attr", "")) == "metric"
            ):
                continue
            if not (node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in CATALOG):
                continue
            m, given = CATALOG[node.args[0].value], {k.arg for k in node.keywords}
            if (set(m.labels) if m.at_zero else set()) != given:
                wrong.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {m.name} {sorted(given)}")
    assert not wrong, wrong
