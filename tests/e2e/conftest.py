"""The shared cluster: the real local runtime (Redis, Ray, Serve, vLLM) on free ports with the `tiny`
profile, exactly as `make run` starts it. Package-scoped (`__init__.py` makes tests/e2e a package):
started for the first test here that needs it and stopped when this package is done, so the rest of
the suite does not share two cores with its idle engines. Its tiny models are a private copy
(OMNIRAY_DATA, for this process and the cluster's: a test changes one on disk under it); the other
profiles' (tiny's transcriber is small's Whisper) are links to the shared ones."""

from __future__ import annotations

import shutil

import pytest

from services.common.paths import data_dir
from services.quota import LOCAL_API_KEY
from tests.conftest import ENCODER_AUTOSCALING, local_cluster


@pytest.fixture(scope="package")
def omniray(otlp_receiver, tmp_path_factory):
    shared, private = data_dir() / "models", tmp_path_factory.mktemp("data") / "models"
    shutil.copytree(shared / "tiny", private / "tiny")
    for other in shared.iterdir():
        if other.name != "tiny":
            (private / other.name).symlink_to(other)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMNIRAY_DATA", str(private.parent))
        with local_cluster(
            "tiny", stage_overrides={"encoder": ENCODER_AUTOSCALING}, env_vars=otlp_receiver.env
        ) as cluster:
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
