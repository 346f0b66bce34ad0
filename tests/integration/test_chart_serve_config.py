"""The Serve config the Helm chart ships (helm/omniray/files/serve/tiny.yaml) serves on a real Ray
node set up as the chart sets up its pods: the node advertises the pool resources of the chart's
groups, and Redis, models and tenants come from the node's environment (OMNIRAY_REDIS_URL,
OMNIRAY_DATA, OMNIRAY_TENANTS_FILE) rather than from the Serve config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import httpx
import yaml

from services import deploy, runtime
from services.common.paths import data_dir
from tests.conftest import AUTH

POOLS = sorted(set(deploy.STAGE_POOLS.values()))


def test_chart_serve_config_serves_on_pool_nodes(tmp_path):
    config = yaml.safe_load((deploy.CHART_DIR / "files" / "serve" / "tiny.yaml").read_text())
    cluster = runtime.LocalCluster(
        run_dir=tmp_path,
        http_port=runtime.free_port(),
        grpc_port=runtime.free_port(),
        gcs_port=runtime.free_port(),
        dashboard_port=runtime.free_port(),
        redis_port=runtime.free_port(),
        metrics_port=runtime.free_port(),
        ray_temp_dir=f"/tmp/omniray-chart-{os.getpid()}-{int(time.time())}",
        run_id=uuid.uuid4().hex,
    )
    # free ports instead of the pods' 8000 / 9000 (other runs may hold them here)
    config["http_options"]["port"], config["grpc_options"]["port"] = cluster.http_port, cluster.grpc_port
    cluster.save()
    try:
        cluster.redis_pid = runtime.start_redis(cluster.redis_port, tmp_path).pid
        cluster.save()
        env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            runtime.RUN_ID_ENV: cluster.run_id,
            # what the chart's pods get (helm/omniray/templates/_helpers.tpl: omniray.rayPod)
            "OMNIRAY_DATA": str(data_dir()),
            "OMNIRAY_REDIS_URL": cluster.redis_url,
            "OMNIRAY_TENANTS_FILE": str(deploy.CHART_DIR / "files" / "tenants" / "local.yaml"),
        }
        pools = {deploy.pool_resource(p): deploy.POOL_RESOURCE_UNITS for p in POOLS}
        ray = runtime._bin("ray")
        subprocess.run(
            [ray, "start", "--head", f"--port={cluster.gcs_port}", "--node-ip-address=127.0.0.1"]
            + [
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={cluster.dashboard_port}",
            ]
            + [f"--metrics-export-port={cluster.metrics_port}", f"--temp-dir={cluster.ray_temp_dir}"]
            + ["--disable-usage-stats", f"--resources={json.dumps(pools)}"],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        cfg = tmp_path / "serve_config.yaml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        subprocess.run(
            [runtime._bin("serve"), "deploy", str(cfg), "-a", cluster.dashboard_url],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        runtime._wait_ready(cluster, timeout_s=420)

        r = httpx.post(
            f"{cluster.http_url}/v1/chat/completions",
            headers=AUTH,
            json={"model": "omniray-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4

        # every replica holds one unit of its stage's pool resource (a driver in its own process:
        # this one may already be connected to the session's cluster)
        probe = (
            "import json, ray; ray.init(address='auto', log_to_driver=False); "
            "total, free = ray.cluster_resources(), ray.available_resources(); "
            "print(json.dumps({k: total[k] - free.get(k, 0) for k in total}))"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe],
            env={**env, "RAY_ADDRESS": cluster.ray_address},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        used = json.loads(out.stdout.strip().splitlines()[-1])
        held = {name: used[name] for name in pools}
        stages = yaml.safe_load((deploy.CHART_DIR / "files" / "serve" / "tiny.yaml").read_text())
        want: dict[str, float] = dict.fromkeys(pools, 0.0)
        for dep in stages["applications"][0]["deployments"]:
            replicas = dep.get("num_replicas") or dep["autoscaling_config"]["min_replicas"]
            for name, units in dep["ray_actor_options"]["resources"].items():
                want[name] += units * replicas
        assert held == want
    finally:
        runtime.stop(tmp_path, graceful=False)
