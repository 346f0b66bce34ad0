"""The chart's alert rules: valid for Prometheus (`promtool check rules`), behave as intended on
synthetic series (`promtool test rules` with alerts/omniray_test.yaml), and read only metrics the
code defines."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import ray
import yaml

from services.deploy import render
from tests.chart.helpers import one, tool

ALERTS = Path(__file__).parent / "alerts"
REQUIRED = {
    "OmnirayAudioTtfpSloBreach",
    "OmnirayKvPoolNearlyFull",
    "OmnirayQuotaRejectionSpike",
    "OmnirayFeatureVersionMismatch",
    "OmnirayServeReplicaChurn",
    "OmnirayRayPodRestarts",
}
# Not ours: kube-state-metrics, present wherever the Prometheus Operator stack runs.
EXTERNAL = {"kube_pod_container_status_restarts_total"}


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> Path:
    """The PrometheusRule's groups as a Prometheus rules file beside a copy of the unit tests."""
    docs = render({"metrics": {"prometheusRule": {"enabled": True}}}, namespace="omniray")
    spec = one(docs, "PrometheusRule")["spec"]
    out = tmp_path_factory.mktemp("alerts")
    (out / "omniray-rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(ALERTS / "omniray_test.yaml", out)
    return out


def _promtool() -> str:
    path = tool("promtool")
    assert path, "promtool not found: `make setup` installs it (apt package prometheus)"
    return path


def test_required_alerts_exist(rules):
    spec = yaml.safe_load((rules / "omniray-rules.yaml").read_text())
    assert {r["alert"] for g in spec["groups"] for r in g["rules"]} == REQUIRED


def test_rules_check(rules):
    out = subprocess.run(
        [_promtool(), "check", "rules", str(rules / "omniray-rules.yaml")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(REQUIRED)} rules found" in out.stdout


def test_rules_unit_tests(rules):
    out = subprocess.run(
        [_promtool(), "test", "rules", "omniray_test.yaml"], cwd=rules, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_read_only_defined_metrics(rules):
    spec = yaml.safe_load((rules / "omniray-rules.yaml").read_text())
    root = Path(__file__).resolve().parents[2]
    defined = set()
    for package in (root / "services", root / "kv_store", Path(ray.__file__).parent / "serve"):
        for py in package.rglob("*.py"):
            defined |= {f"ray_{n}" for n in re.findall(r'"((?:omniray|serve)_[a-z0-9_]+)"', py.read_text())}
    for group in spec["groups"]:
        for rule in group["rules"]:
            used = set(re.findall(r"\b((?:ray|kube)_[a-z0-9_]+)\b", rule["expr"])) - EXTERNAL
            # histograms export _bucket series; Ray exports counters with a _total suffix
            names = {re.sub(r"_bucket$", "", n) for n in used}
            names = {n if n in defined else re.sub(r"_total$", "", n) for n in names}
            assert names <= defined, (rule["alert"], names - defined)
