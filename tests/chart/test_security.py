"""The chart is secure by default (issue 19, part 4), asserted on the rendered manifests of every
values set: no developer tenant unless asked for, every pod non-root with a read-only root, no
capabilities and seccomp RuntimeDefault, a service-account token only where the autoscaler needs it
(with a least-privilege Role), NetworkPolicies that admit only the gateway ports from outside and
Redis only from the Ray pods, no Service for Ray's own ports, and no API keys in metrics."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from services import deploy
from services.common.metric_catalog import CATALOG
from tests.chart.helpers import VALUES_FILES, by_kind, notes, one, values

RENDERS = [*VALUES_FILES, "all-on"]
RAY_PORTS = {"gcs-server", "dashboard", "client", 6379, 8265, 10001}


def pods(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every pod the release runs: the Ray head and workers, Redis."""
    cluster = one(docs, "RayService")["spec"]["rayClusterConfig"]
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster["workerGroupSpecs"]]
    out = [(name, g["template"]["spec"]) for name, g in groups]
    return out + [
        (s["metadata"]["name"], s["spec"]["template"]["spec"]) for s in by_kind(docs, "StatefulSet")
    ]


def tenants(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cm = one(docs, "ConfigMap", "omniray-tenants")
    return yaml.safe_load(cm["data"]["tenants.yaml"])["tenants"]


def test_no_developer_tenant_unless_asked_for(rendered):
    assert tenants(rendered["default"]) == [] and tenants(rendered["gpu"]) == []
    assert [t["id"] for t in tenants(rendered["cpu-dev"])] == ["local"]
    default = notes({})
    assert "every request is refused (401)" in default and "api_key_sha256" in default
    assert "sk-omniray-local" not in default
    assert "WARNING: the developer tenant" in notes(values("cpu-dev"))


@pytest.mark.parametrize("name", RENDERS)
def test_every_container_is_non_root_read_only_and_without_capabilities(rendered, name):
    docs = rendered[name]
    for pod_name, spec in pods(docs):
        sc = spec["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, pod_name
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, pod_name
        for c in spec.get("initContainers", []) + spec["containers"]:
            csc = c["securityContext"]
            assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False, (
                pod_name,
                c["name"],
            )
            assert csc["capabilities"] == {"drop": ["ALL"]}, (pod_name, c["name"])
    cluster = one(docs, "RayService")["spec"]["rayClusterConfig"]
    if cluster["enableInTreeAutoscaling"]:  # KubeRay's autoscaler sidecar, in the head pod
        sidecar = cluster["autoscalerOptions"]["securityContext"]
        assert sidecar["readOnlyRootFilesystem"] is True and sidecar["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("name", RENDERS)
def test_only_the_autoscaler_gets_a_token_and_only_what_it_needs(rendered, name):
    docs = rendered[name]
    autoscaling = one(docs, "RayService")["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"]
    for pod_name, spec in pods(docs):
        assert spec["automountServiceAccountToken"] is (autoscaling and pod_name == "head"), pod_name
    if not autoscaling:
        assert not by_kind(docs, "Role") and not by_kind(docs, "ServiceAccount")
        return
    (role,) = by_kind(docs, "Role")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("",), ("pods",)): {"get", "list", "watch", "patch"},
        (("ray.io",), ("rayclusters",)): {"get", "patch"},
    }
    (binding,) = by_kind(docs, "RoleBinding")
    (account,) = by_kind(docs, "ServiceAccount")
    assert (
        binding["roleRef"]["name"] == role["metadata"]["name"]
        and binding["subjects"][0]["name"] == account["metadata"]["name"]
    )
    head = one(docs, "RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == account["metadata"]["name"]


def test_without_autoscaling_no_pod_mounts_a_token():
    docs = deploy.render({"ray": {"enableInTreeAutoscaling": False}})
    assert all(spec["automountServiceAccountToken"] is False for _, spec in pods(docs))
    assert not by_kind(docs, "Role") and not by_kind(docs, "ServiceAccount")


@pytest.mark.parametrize("name", RENDERS)
def test_network_policies_admit_only_the_gateway_from_outside(rendered, name):
    docs = rendered[name]
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    ray, redis = policies["omniray-ray"], policies["omniray-redis"]
    ray_pods = {"app.kubernetes.io/name": "omniray", "app.kubernetes.io/instance": "omniray",
                "app.kubernetes.io/component": "ray"}  # fmt: skip
    assert ray["podSelector"]["matchLabels"] == ray_pods and ray["policyTypes"] == ["Ingress"]
    open_rules = [r for r in ray["ingress"] if "from" not in r]
    assert [sorted(p["port"] for p in r["ports"]) for r in open_rules] == [["grpc", "serve"]]
    for rule in ray["ingress"]:
        if "from" in rule and "ports" not in rule:  # all ports: only from the release's Ray pods
            assert rule["from"] == [{"podSelector": {"matchLabels": ray_pods}}]
        elif "from" in rule:
            assert {p["port"] for p in rule["ports"]} <= {"dashboard", "metrics"}
    (rule,) = redis["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": ray_pods}}] and rule["ports"] == [
        {"port": "redis", "protocol": "TCP"}
    ]


@pytest.mark.parametrize("name", RENDERS)
def test_no_service_exposes_rays_own_ports(rendered, name):
    for svc in by_kind(rendered[name], "Service"):
        for port in svc["spec"]["ports"]:
            if svc["spec"]["selector"].get("app.kubernetes.io/component") == "ray":
                assert port["targetPort"] in ("serve", "grpc", "metrics") and port["port"] not in RAY_PORTS, (
                    svc["metadata"]["name"]
                )


def test_metrics_carry_no_api_keys():
    labels = {label for m in CATALOG.values() for label in m.labels}
    assert not {label for label in labels if "key" in label or "auth" in label or "token" in label}, labels
    assert "tenant" in labels  # tenants are named by id, never by key
