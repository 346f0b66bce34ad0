"""Every dashboard panel queries metrics the code really defines (Ray exports them as ray_<name>)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "helm" / "omniray" / "dashboards").glob("*.json"))


def _defined_metrics() -> set[str]:
    names = set()
    for package in ("services", "kv_store"):
        for py in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r'"(omniray_[a-z0-9_]+)"', py.read_text()))
    return names


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panels_use_defined_metrics(path):
    defined = _defined_metrics()
    dash = json.loads(path.read_text())
    assert dash["panels"]
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used = set(re.findall(r"ray_(omniray_[a-z0-9_]+?)(?:_bucket|_sum|_count)?\b", target["expr"]))
            assert used, target["expr"]
            assert used <= defined, (panel["title"], used - defined)
