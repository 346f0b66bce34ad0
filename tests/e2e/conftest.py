"""The shared `tiny` deployment, started as the Helm chart starts it: a Ray node advertising the pool
resources of the chart's worker groups and given the environment the chart gives its pods (models,
Redis, tenants, the OTLP endpoint), and on it the Serve config the chart ships
(helm/omniray/files/serve/tiny.yaml) with free ports and the tests' encoder autoscaling. The rest is
`make run`'s runtime (services/runtime.py): Redis, Serve's HAProxy edge, the run's own ports.
test_chart_config.py checks that it is the chart's config and that every replica sits on its pool.

Package-scoped (`__init__.py` makes tests/e2e a package): started for the first test here and stopped
when the package is done, so the rest of the suite does not share two cores with its idle engines.
Tests that kill, drain or redeploy parts of it are in faults/ and run after the others (ordered in
tests/conftest.py), so no other test meets a deployment a fault test has changed. Its tiny models
are a private copy (OMNIRAY_DATA, for this process and the cluster's: a test changes one on disk
under it); the other profiles' (tiny's transcriber is small's Whisper) are links to the shared ones."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from services import deploy, runtime
from services.common import redis_config
from services.common.paths import data_dir
from services.extensions.ray.haproxy_edge import TIMEOUT_ENV as HEADER_READ_TIMEOUT_ENV
from services.models.profile import load_profile
from services.quota import LOCAL_API_KEY
from tests.conftest import ENCODER_AUTOSCALING

PROFILE = "tiny"
CHART_SERVE_CONFIG = deploy.CHART_DIR / "files" / "serve" / f"{PROFILE}.yaml"
CHART_TENANTS = deploy.CHART_DIR / "files" / "tenants" / "local.yaml"
HEADER_READ_TIMEOUT_S = 4
POOLS = {deploy.pool_resource(p): deploy.POOL_RESOURCE_UNITS for p in set(deploy.STAGE_POOLS.values())}


def chart_config(http_port: int, grpc_port: int) -> dict[str, Any]:
    """The chart's Serve config with this run's ports and the tests' encoder autoscaling (short
    delays, so a test can watch the encoder scale)."""
    config = yaml.safe_load(CHART_SERVE_CONFIG.read_text())
    config["http_options"]["port"], config["grpc_options"]["port"] = http_port, grpc_port
    (app,) = config["applications"]
    encoder = next(d for d in app["deployments"] if d["name"] == "Encoder")
    encoder.update(ENCODER_AUTOSCALING)
    return config


@contextlib.contextmanager
def as_the_chart_runs(pod_env: dict[str, str]) -> Iterator[runtime.LocalCluster]:
    with runtime.scratch_run(f"omniray-test-chart-{PROFILE}-") as run_dir:
        cluster = runtime.new_cluster(run_dir, runtime.free_port(), runtime.free_port())
        # what the chart's pods get (helm/omniray/templates/_helpers.tpl: omniray.rayPod)
        pod_env = {
            "OMNIRAY_DATA": str(data_dir()),
            redis_config.ENV: cluster.redis_url,
            "OMNIRAY_TENANTS_FILE": str(CHART_TENANTS),
            # the chart's headerReadTimeoutSeconds, shorter: the slowloris test waits it out
            HEADER_READ_TIMEOUT_ENV: str(HEADER_READ_TIMEOUT_S),
            **pod_env,
        }
        runtime.start_node(cluster, load_profile(PROFILE).limits.max_request_bytes, POOLS, pod_env)
        runtime.apply(cluster, chart_config(cluster.http_port, cluster.grpc_port), timeout_s=420)
        yield cluster


@pytest.fixture(scope="package")
def omniray(otlp_receiver, tmp_path_factory):
    shared, private = data_dir() / "models", tmp_path_factory.mktemp("data") / "models"
    shutil.copytree(shared / PROFILE, private / PROFILE)
    for other in shared.iterdir():
        if other.name != PROFILE:
            (private / other.name).symlink_to(other)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMNIRAY_DATA", str(private.parent))
        with as_the_chart_runs(otlp_receiver.env) as cluster:
            yield cluster


@pytest.fixture(scope="package")
def ray_driver(omniray):
    """This process joined to the test cluster (for Serve handles and status)."""
    import ray

    ray.init(address=omniray.ray_address, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="package")
def openai_client(omniray):
    from openai import OpenAI

    return OpenAI(base_url=f"{omniray.http_url}/v1", api_key=LOCAL_API_KEY, timeout=120, max_retries=0)
