"""helm/omniray rendered offline: lint, Kubernetes and CRD schemas, the Serve config it carries,
stage placement, Redis wiring, values schema errors, and the generated files (no drift)."""

from __future__ import annotations

import json
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from services import deploy
from services.app import DEPLOYMENT_NAMES, SERVE_ENV
from services.models.profile import load_profile
from tests.chart.helpers import VALUES_FILES, by_kind, notes, one, validate, values

RENDERS = [*VALUES_FILES, "all-on"]


def groups(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = doc["spec"]["rayClusterConfig"]
    return {"head": cluster["headGroupSpec"]} | {g["groupName"]: g for g in cluster["workerGroupSpecs"]}


def container(group: dict[str, Any]) -> dict[str, Any]:
    (c,) = group["template"]["spec"]["containers"]
    return c


def env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c["env"]}


@pytest.mark.parametrize("name", VALUES_FILES)
def test_lint_strict(name):
    report = helm_python.lint(str(deploy.CHART_DIR), values(name), strict=True)
    assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize("name", RENDERS)
def test_every_manifest_validates(rendered, name):
    docs = rendered[name]
    assert {"RayService", "Service", "StatefulSet", "ConfigMap"} <= {d["kind"] for d in docs}
    for doc in docs:
        validate(doc)


def test_all_on_renders_every_optional_part(rendered):
    kinds = {d["kind"] for d in rendered["all-on"]}
    assert {"Ingress", "ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
    sts = one(rendered["all-on"], "StatefulSet")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"
    assert (
        "--appendonly" in (args := container_of(sts)["args"])
        and args[args.index("--appendonly") + 1] == "yes"
    )


def container_of(workload: dict[str, Any]) -> dict[str, Any]:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def test_crd_schema_rejects_what_the_operator_would():
    """The repo's RayService schema is strict: a misspelt field fails (so the test above can fail)."""
    doc = one(deploy.render({}), "RayService")
    doc["spec"]["rayClusterConfig"]["workerGroupSpec"] = doc["spec"]["rayClusterConfig"].pop(
        "workerGroupSpecs"
    )
    with pytest.raises(jsonschema.ValidationError, match="workerGroupSpec"):
        validate(doc)


@pytest.mark.parametrize("name", RENDERS)
def test_serve_config_is_the_profiles(rendered, name):
    profile = (values(name) if name in VALUES_FILES else {}).get("profile", "small")
    doc = one(rendered[name], "RayService")
    serve = yaml.safe_load(doc["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve)
    assert serve == deploy.cluster_serve_config(profile)
    assert serve["applications"][0]["args"]["profile"] == profile
    # the ports Serve binds are the head's named ports, which the Services target
    head_ports = {p["name"]: p["containerPort"] for p in container(groups(doc)["head"])["ports"]}
    assert serve["http_options"] == {**serve["http_options"], "host": "0.0.0.0", "port": head_ports["serve"]}
    assert serve["grpc_options"]["port"] == head_ports["grpc"]
    assert serve["proxy_location"] == "HeadOnly"
    services = {s["metadata"]["name"]: s for s in by_kind(rendered[name], "Service")}
    for svc_name, port_name in (("omniray", "serve"), ("omniray-grpc", "grpc")):
        svc = services[svc_name]
        assert svc["spec"]["selector"]["ray.io/node-type"] == "head"
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == [port_name]


@pytest.mark.parametrize("name", RENDERS)
def test_each_stage_lands_on_its_pool(rendered, name):
    """A stage's replicas request its pool's custom resource, which only that group advertises; GPU
    stages land on a group whose pods have at least the GPUs a replica asks for."""
    doc = one(rendered[name], "RayService")
    advertised = {
        group_name: json.loads(json.loads(group["rayStartParams"]["resources"]))
        for group_name, group in groups(doc).items()
    }
    deployments = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"][0]["deployments"]
    stage_of = {v: k for k, v in DEPLOYMENT_NAMES.items()}
    for dep in deployments:
        pool = deploy.STAGE_POOLS[stage_of[dep["name"]]]
        wanted = dep["ray_actor_options"]["resources"]
        hosts = [g for g, res in advertised.items() if all(res.get(k, 0) >= v for k, v in wanted.items())]
        assert hosts == [pool], (dep["name"], hosts)
        gpus = dep["ray_actor_options"].get("num_gpus", 0)
        limits = container(groups(doc)[pool])["resources"].get("limits", {})
        assert float(limits.get("nvidia.com/gpu", 0)) >= gpus, (dep["name"], limits)


def test_gpu_values_put_every_model_stage_on_gpu_nodes(rendered):
    """The GPU values: the thinker pool, the encoder pool and the speech pool run on GPU nodes, and
    Encoder, Talker and Code2Wav replicas take a share of a GPU (two to a GPU), each with its own
    autoscaling bounds (the seed's 2x Talker, 2x Code2Wav at least)."""
    doc = one(rendered["gpu"], "RayService")
    for pool in ("thinker", "encoder", "speech"):
        group = groups(doc)[pool]
        spec = group["template"]["spec"]
        assert container(group)["resources"]["limits"]["nvidia.com/gpu"] == 1, pool
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}, pool
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    mounts = {m["mountPath"] for m in container(groups(doc)["thinker"])["volumeMounts"]}
    assert "/models" in mounts  # the profile's absolute checkpoint path
    deployments = {
        d["name"]: d for d in yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"][0]["deployments"]
    }
    for stage, least in (("encoder", 1), ("talker", 2), ("vocoder", 2)):
        dep = deployments[DEPLOYMENT_NAMES[stage]]
        assert 0 < dep["ray_actor_options"]["num_gpus"] < 1, stage
        scaling = dep["autoscaling_config"]
        assert least <= scaling["min_replicas"] < scaling["max_replicas"], (stage, scaling)
        assert "num_replicas" not in dep, stage
    # the speech pool holds the least replicas the profile asks for (two to a GPU)
    speech = groups(doc)["speech"]
    floor = sum(
        deployments[DEPLOYMENT_NAMES[s]]["autoscaling_config"]["min_replicas"] for s in ("talker", "vocoder")
    )
    assert speech["minReplicas"] * 2 >= floor


@pytest.mark.parametrize("name", RENDERS)
def test_pods_get_redis_url_tenants_and_data(rendered, name):
    docs = rendered[name]
    for group in groups(one(docs, "RayService")).values():
        c = container(group)
        e = env(c)
        assert e["OMNIRAY_DATA"]["value"] == "/data"
        secret_ref = e["OMNIRAY_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert secret_ref == {"name": "omniray-redis", "key": "password"}
        # k8s expands $(VAR) only from variables defined earlier in the list
        names = [x["name"] for x in c["env"]]
        assert names.index("OMNIRAY_REDIS_PASSWORD") < names.index("OMNIRAY_REDIS_URL")
        assert e["OMNIRAY_REDIS_URL"]["value"] == "redis://:$(OMNIRAY_REDIS_PASSWORD)@omniray-redis:6379/0"
        assert e["OMNIRAY_TENANTS_FILE"]["value"] == "/etc/omniray/tenants/tenants.yaml"
        profile = yaml.safe_load(one(docs, "RayService")["spec"]["serveConfigV2"])["applications"][0]["args"][
            "profile"
        ]
        # A terminated pod waits longer than its replicas' graceful shutdown.
        grace = max(stage.graceful_shutdown_timeout_s for stage in load_profile(profile).stages.values())
        assert group["template"]["spec"]["terminationGracePeriodSeconds"] > grace
        # The gRPC proxy takes no larger message than the profile takes as a REST body.
        assert (
            int(e["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"]["value"])
            == load_profile(profile).limits.max_request_bytes
        )
        # Ray Serve runs as `make run` runs it (HAProxy ingress, throughput-optimized).
        assert {k: e[k]["value"] for k in SERVE_ENV} == SERVE_ENV
        # its HAProxy through omniray's launcher (the image's venv), with the header-read timeout
        assert e["RAY_SERVE_HAPROXY_BINARY_PATH"]["value"] == "/opt/venv/bin/omniray-haproxy"
        assert int(e["OMNIRAY_HEADER_READ_TIMEOUT_S"]["value"]) > 0
        init = group["template"]["spec"]["initContainers"][0]
        assert (
            init["command"][-1]
            == yaml.safe_load(one(docs, "RayService")["spec"]["serveConfigV2"])["applications"][0]["args"][
                "profile"
            ]
        )
    secret = one(docs, "Secret", "omniray-redis")
    assert len(secret["data"]["password"]) > 20
    redis = container_of(one(docs, "StatefulSet", "omniray-redis"))
    assert "$(REDIS_PASSWORD)" in redis["args"]
    assert one(docs, "Service", "omniray-redis")["spec"]["ports"][0]["port"] == 6379


def test_existing_secret_and_external_redis():
    docs = deploy.render({"redis": {"auth": {"existingSecret": "mine", "existingSecretKey": "pw"}}})
    assert not [s for s in by_kind(docs, "Secret")]
    ref = env(container(groups(one(docs, "RayService"))["thinker"]))["OMNIRAY_REDIS_PASSWORD"]
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "pw"}

    docs = deploy.render(
        {"redis": {"enabled": False, "external": {"url": "redis://:pw@cache.example:6379/2"}}}
    )
    assert not by_kind(docs, "StatefulSet")
    url = one(docs, "Secret", "omniray-redis-url")
    assert url["stringData" if "stringData" in url else "data"]["url"]
    e = env(container(groups(one(docs, "RayService"))["head"]))
    assert "OMNIRAY_REDIS_PASSWORD" not in e
    assert e["OMNIRAY_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "omniray-redis-url", "key": "url"}
    for doc in docs:
        validate(doc)


def test_external_redis_needs_a_url():
    with pytest.raises(helm_python.HelmError, match="redis.external.url or redis.external.existingSecret"):
        deploy.render({"redis": {"enabled": False}})


def test_tenants_configmap():
    dev = yaml.safe_load(
        one(deploy.render({"tenants": {"devTenant": True}}), "ConfigMap", "omniray-tenants")["data"][
            "tenants.yaml"
        ]
    )
    assert [t["id"] for t in dev["tenants"]] == ["local"]
    mine = {"id": "acme", "api_key_sha256": ["0" * 64], "default_class": "interactive"}
    docs = deploy.render({"tenants": {"devTenant": False, "tenants": [mine]}})
    assert yaml.safe_load(one(docs, "ConfigMap", "omniray-tenants")["data"]["tenants.yaml"]) == {
        "tenants": [mine]
    }
    docs = deploy.render({"tenants": {"existingConfigMap": "acme-tenants"}})
    assert not [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"] == "omniray-tenants"]
    volumes = {v["name"]: v for v in groups(one(docs, "RayService"))["head"]["template"]["spec"]["volumes"]}
    assert volumes["tenants"]["configMap"]["name"] == "acme-tenants"


def test_dashboards_ship_as_sidecar_configmaps():
    shipped = sorted((deploy.CHART_DIR / "dashboards").glob("*.json"))
    docs = deploy.render({"dashboards": {"label": "grafana_dashboard", "labelValue": "yes"}})
    maps = [
        c for c in by_kind(docs, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard") == "yes"
    ]
    assert len(maps) == len(shipped) >= 4
    contents = {k: v for c in maps for k, v in c["data"].items()}
    assert contents == {p.name: p.read_text().rstrip("\n") for p in shipped}
    assert not [
        c
        for c in by_kind(deploy.render({"dashboards": {"enabled": False}}), "ConfigMap")
        if "grafana_dashboard" in c["metadata"]["labels"]
    ]


def test_monitors_scrape_every_ray_pod(rendered):
    docs = rendered["all-on"]
    pod_labels = [g["template"]["metadata"]["labels"] for g in groups(one(docs, "RayService")).values()]
    pod_monitor = one(docs, "PodMonitor")
    assert all(
        pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items() for labels in pod_labels
    )
    metrics_svc = one(docs, "Service", "omniray-ray-metrics")
    assert metrics_svc["spec"]["clusterIP"] == "None"
    assert all(metrics_svc["spec"]["selector"].items() <= labels.items() for labels in pod_labels)
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= metrics_svc["metadata"]["labels"].items()
    for group in groups(one(docs, "RayService")).values():
        assert {"name": "metrics", "containerPort": 8080} in container(group)["ports"]
        assert group["rayStartParams"]["metrics-export-port"] == "8080"


def test_notes_tell_how_to_reach_it():
    default, gpu, dev = notes({}), notes(values("gpu")), notes(values("cpu-dev"))
    assert "port-forward svc/omniray 8000:8000" in default and "/v1/realtime" in default
    assert "port-forward svc/omniray-grpc 9000:9000" in default
    assert "sk-omniray-local" in dev and "WARNING" in dev
    assert "sk-omniray-local" not in gpu and "ConfigMap omniray-tenants" in gpu


BAD_VALUES = [
    ({"ray": {"workerGroups": {"thinker": {"replicas": -1}}}}, "/ray/workerGroups/thinker/replicas"),
    ({"ray": {"workerGroups": {"thinker": {"gpus": "1"}}}}, "/ray/workerGroups/thinker/gpus"),
    ({"ray": {"workerGroups": {"gpu": {"enabled": True}}}}, "additional properties 'gpu' not allowed"),
    ({"redis": {"persistance": {"enabled": True}}}, "additional properties 'persistance' not allowed"),
    ({"profile": "large"}, "/profile"),
    ({"service": {"httpPort": "8000"}}, "/service/httpPort"),
    ({"redis": {"auth": {"password": "p@ss/word"}}}, "/redis/auth/password"),
    ({"ray": {"head": {"rayStartParams": {"resources": "{}"}}}}, "/ray/head/rayStartParams"),
    ({"ray": {"authMode": "none"}}, "/ray/authMode"),
    (
        {"metrics": {"prometheusRule": {"audioTtfp": {"quantile": 90}}}},
        "/metrics/prometheusRule/audioTtfp/quantile",
    ),
]


@pytest.mark.parametrize(("bad", "where"), BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_bad_values_fail_with_a_schema_error(bad, where):
    with pytest.raises(helm_python.HelmValuesError) as err:
        deploy.render(bad)
    assert "values don't meet the specifications of the schema" in str(err.value)
    assert where in str(err.value), str(err.value)


def test_schema_knows_every_generated_profile():
    schema = json.loads((deploy.CHART_DIR / "values.schema.json").read_text())
    assert schema["properties"]["profile"]["enum"] == deploy.profiles()


def test_generated_files_have_not_drifted():
    """helm/omniray/files and k8s/ are what `make chart` writes now (edit a profile, run it)."""
    expected = deploy.chart_files() | deploy.k8s_files()
    stale = [
        str(p.relative_to(deploy.REPO_ROOT))
        for p, text in expected.items()
        if not p.exists() or p.read_text() != text
    ]
    assert not stale, f"run `make chart`: {stale}"
    generated = {p for d in (deploy.CHART_DIR / "files", deploy.K8S_DIR) for p in d.rglob("*") if p.is_file()}
    assert generated == set(expected), f"not written by `make chart`: {generated - set(expected)}"


def test_upgrades_drain_through_serves_graceful_shutdown():
    """A new cluster takes over on upgrade and the old one drains for a while; the replicas' graceful
    shutdown comes from the values into every Serve deployment, and a pod's termination grace must
    outlast it (a render that would cut responses off fails)."""
    default = one(deploy.render({}), "RayService")["spec"]
    assert (
        default["upgradeStrategy"] == {"type": "NewCluster"}
        and default["rayClusterDeletionDelaySeconds"] >= 120
    )
    spec = one(
        deploy.render({"gracefulShutdownSeconds": 200, "terminationGracePeriodSeconds": 240}), "RayService"
    )["spec"]
    config = yaml.safe_load(spec["serveConfigV2"])
    ServeDeploySchema.model_validate(config)
    assert {d["graceful_shutdown_timeout_s"] for a in config["applications"] for d in a["deployments"]} == {
        200
    }
    assert all(
        g["template"]["spec"]["terminationGracePeriodSeconds"] == 240 for g in groups({"spec": spec}).values()
    )
    with pytest.raises(
        helm_python.errors.HelmRenderError, match="must be longer than the replicas' graceful shutdown"
    ):
        deploy.render({"gracefulShutdownSeconds": 200})
