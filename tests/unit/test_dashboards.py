"""The shipped dashboards: the required set exists, every panel's PromQL parses (`promtool check
rules` on the extracted expressions) and reads only metrics the metric catalog declares
(services/common/metric_catalog.py) or Ray Serve exports. That the metrics are really emitted is
checked against a running system in tests/e2e/test_dashboard_metrics.py."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import ray
import yaml

from services.common.metric_catalog import CATALOG
from tests.dashboards import DASHBOARDS, ROOT, exprs, series_names

HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def _serve_metrics() -> set[str]:
    """Ray Serve's own metric names (string literals in the installed Ray), as exported."""
    names = set()
    for py in (Path(ray.__file__).parent / "serve").rglob("*.py"):
        names |= {f"ray_{n}" for n in re.findall(r'"(serve_[a-z0-9_]+)"', py.read_text())}
    return names


def _catalog() -> set[str]:
    return {f"ray_{name}" for name in CATALOG}


def test_code_creates_only_catalog_metrics():
    """Every omniray metric name in the code is one the catalog declares (made with metric(name))."""
    named = set()
    for root in ("services", "kv_store"):
        for py in (ROOT / root).rglob("*.py"):
            named |= set(
                re.findall(
                    r'"(omniray_[a-z0-9_]+_(?:total|seconds|ratio|depth|tiles|requests|limit|sessions))"',
                    py.read_text(),
                )
            )
    assert named <= set(CATALOG), sorted(named - set(CATALOG))


def test_the_required_dashboards_exist():
    assert {p.stem for p in DASHBOARDS} >= {"overview", "stages", "kv-store", "sessions"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panels_use_defined_metrics(path):
    # ours from the catalog, Serve's from the installed Ray
    defined = _catalog() | _serve_metrics()
    for title, expr in exprs(path):
        used = {HISTOGRAM_SUFFIX.sub("", n) for n in series_names(expr)}
        assert used, (title, expr)
        assert used <= defined, (title, used - defined)


def test_every_panel_expression_parses(tmp_path):
    assert shutil.which("promtool"), "promtool missing: `make system-deps` installs it (apt: prometheus)"
    rules = [
        {"record": f"omniray:dashboard_{path.stem.replace('-', '_')}_{i}", "expr": expr}
        for path in DASHBOARDS
        for i, (_, expr) in enumerate(exprs(path))
    ]
    assert rules
    f = tmp_path / "dashboards.rules.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout
