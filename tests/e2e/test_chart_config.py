"""The Serve config the Helm chart ships serves as the chart deploys it. This package's shared
deployment is that config (helm/omniray/files/serve/tiny.yaml) on a Ray node set up as the chart sets
up its pods (tests/e2e/conftest.py), so every test here runs against it. What is checked here: the
deployment is the chart's file, changed only in its ports and the encoder's autoscaling; Redis, models
and tenants reach the replicas from the node's environment, not from the config; and every replica
holds one unit of its stage's pool resource, so on KubeRay it lands on its own worker group."""

from __future__ import annotations

import copy
import json
import time
import urllib.request
from collections import Counter

import yaml

from services import runtime
from services.common import redis_config
from tests.e2e.conftest import CHART_SERVE_CONFIG, POOLS


def _app_without_what_the_tests_change(app: dict) -> dict:
    app = copy.deepcopy(app)
    next(d for d in app["deployments"] if d["name"] == "Encoder").pop("autoscaling_config")
    return app


def test_serve_runs_the_charts_serve_config(omniray):
    """What Serve's controller reports it runs (not the file this run wrote) is the chart's app."""
    with urllib.request.urlopen(f"{omniray.dashboard_url}/api/serve/applications/", timeout=10) as r:
        running = json.load(r)["applications"]["omniray"]["deployed_app_config"]
    (chart,) = yaml.safe_load(CHART_SERVE_CONFIG.read_text())["applications"]
    assert _app_without_what_the_tests_change(running) == _app_without_what_the_tests_change(chart)
    env = chart.get("runtime_env", {}).get("env_vars", {})
    assert not {"OMNIRAY_DATA", redis_config.ENV, "OMNIRAY_TENANTS_FILE"} & set(env), env


def test_every_replica_holds_one_unit_of_its_pool(omniray, ray_driver):
    import ray
    from ray.util.state import list_actors

    (app,) = runtime.applied(omniray)["applications"]
    pool_of = {d["name"]: d["ray_actor_options"]["resources"] for d in app["deployments"]}
    deadline = time.monotonic() + 60  # a replica starting or stopping holds its unit a moment longer
    while True:
        alive = list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
        replicas = Counter(
            a["class_name"].removeprefix("ServeReplica:omniray:")
            for a in alive
            if a["class_name"].startswith("ServeReplica:omniray:")
        )
        want = dict.fromkeys(POOLS, 0.0)
        for name, resources in pool_of.items():
            for resource, units in resources.items():
                want[resource] += units * replicas[name]
        total, free = ray.cluster_resources(), ray.available_resources()
        held = {name: total[name] - free.get(name, 0) for name in POOLS}
        if held == want or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert set(replicas) == set(pool_of), replicas
    assert held == want
