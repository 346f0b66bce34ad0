"""The shipped dashboards: the required set exists, every panel's PromQL parses (`promtool check
rules` on the extracted expressions) and reads only metrics the code defines. That the metrics are
really emitted is checked against a running system in tests/e2e/test_dashboard_metrics.py."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import ray
import yaml

from tests.dashboards import DASHBOARDS, ROOT, exprs, series_names

HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def _defined(packages: list[Path]) -> set[str]:
    """Metric names created in the code (string literals), as Ray exports them (ray_ prefix)."""
    names = set()
    for package in packages:
        for py in package.rglob("*.py"):
            names |= {f"ray_{n}" for n in re.findall(r'"((?:omniray|serve)_[a-z0-9_]+)"', py.read_text())}
    return names


def test_the_required_dashboards_exist():
    assert {p.stem for p in DASHBOARDS} >= {"overview", "stages", "kv-store", "sessions"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panels_use_defined_metrics(path):
    # ours from services/ and kv_store/, Serve's from the installed Ray
    defined = _defined([ROOT / "services", ROOT / "kv_store", Path(ray.__file__).parent / "serve"])
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
