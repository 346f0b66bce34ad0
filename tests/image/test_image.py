"""The CPU image works (`make test-image`, after `make image`): it runs as the chart's head pod runs
it — the models init container, then `ray start --head` with the pod's env, user, read-only root
filesystem, dropped capabilities and /tmp scratch, taken from the rendered chart (values-cpu-dev:
profile tiny) — and the Serve config goes in through the dashboard as KubeRay puts it. The official
SDK then gets a chat answer and speech. One container stands in for the cluster: the head advertises
every pool's resource, so the stages that the chart puts on worker groups start beside the gateway.
Ray's token auth is off (KubeRay makes the token; docs/deploy.md)."""

from __future__ import annotations

import json
import time
import uuid
from types import SimpleNamespace

import pytest
import yaml
from openai import OpenAI

from services import deploy, runtime
from services.quota import LOCAL_API_KEY
from tests.chart.helpers import one, values
from tests.image import pods

pytestmark = pytest.mark.image

POOLS = ("head", "encoder", "thinker", "speech")


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    docs = deploy.render(values("cpu-dev"))
    service = one(docs, "RayService")
    cluster = service["spec"]["rayClusterConfig"]
    pod = cluster["headGroupSpec"]["template"]["spec"]
    (ray_head,) = pod["containers"]
    mounts = pods.volumes(tmp_path_factory, docs, pod)
    redis_port = runtime.free_port()
    redis = runtime.start_redis(redis_port, tmp_path_factory.mktemp("redis"))
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    name = f"omniray-head-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    pods.run_init(pod, redis_url, mounts)
    params = dict(cluster["headGroupSpec"]["rayStartParams"])
    params["resources"] = json.dumps(
        json.dumps({f"omniray_pool_{p}": 1000 for p in POOLS})
    )  # as the chart quotes it
    pods.start_node(name, pod, ray_head, params, redis_url, mounts, head=True, shm_size="2g")
    try:
        pods.wait("Ray's dashboard", lambda: pods.get(f"{pods.DASHBOARD}/api/version"), 180, [name])
        pods.deploy_serve(service)
        # ready as KubeRay judges a RayService: the Serve application RUNNING (every replica up)
        pods.wait("the Serve application", lambda: pods.serve_app().get("status") == "RUNNING", 900, [name])
        pods.wait("the gateway", pods.gateway_ok, 60, [name])
        yield SimpleNamespace(
            name=name, url="http://127.0.0.1:8000", started=t0, ready_s=time.monotonic() - t0
        )
    finally:
        pods.docker("rm", "-f", name, check=False)
        redis.terminate()
        redis.wait(10)


def test_the_container_runs_as_the_chart_says(head):
    info = json.loads(pods.docker("inspect", head.name).stdout)[0]
    assert info["Config"]["User"] == "1000:1000" and info["HostConfig"]["ReadonlyRootfs"] is True
    assert info["HostConfig"]["CapDrop"] == ["ALL"]
    version = pods.docker("exec", head.name, "ray", "--version").stdout
    assert yaml.safe_load((deploy.CHART_DIR / "values.yaml").read_text())["ray"]["version"] in version


def test_the_sdk_gets_a_chat_answer_and_speech(head):
    client = OpenAI(base_url=f"{head.url}/v1", api_key=LOCAL_API_KEY, timeout=120, max_retries=0)
    (model,) = [m.id for m in client.models.list().data if m.id == "omniray-tiny"]
    t0 = time.monotonic()
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8, temperature=0
    )
    first = time.monotonic() - t0
    assert answer.choices[0].message.content and answer.usage.completion_tokens == 8
    speech = client.audio.speech.create(
        model=model, voice="alloy", input="Hello there.", response_format="wav"
    ).read()
    assert speech[:4] == b"RIFF" and len(speech) > 44
    print(f"[image] Serve application running {head.ready_s:.0f} s after the init container started; first chat answer "
          f"{time.monotonic() - head.started:.0f} s after it (the request itself {first:.1f} s)")  # fmt: skip
