"""`make soak`: the Locust mix of `make loadtest` for a long run (30 minutes by default) with faults:
the vocoder replica's process is killed a third of the way in, Redis is killed and restarted on its
port at two thirds. Reports failures split into clean errors (an OpenAI/gRPC/realtime error the
client was told, e.g. `stage_unavailable` while the replica was replaced) and lost requests (anything
else: a timeout, a dropped connection, a stream that ended without its end), and the RSS of the
gateway and the thinker engines (replica process + its vLLM engine core) after warm-up and at the
end. Writes summary.json under loadtest/results/soak-<time>/.

    python -m loadtest.locustfiles.soak --users 8 --minutes 30
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from loadtest import results
from loadtest.locustfiles.locust_run import TENANTS, locust_command, warm_up
from services import runtime
from services.models.profile import load_profile

MEASURED = ("Gateway", "Prefill", "Decode")  # replicas whose RSS must stay flat (not killed)
# Failures that are an error the client was told (a fault it can retry), not a loss: an error code
# or gRPC status of an unavailable stage or quota store, or a realtime response.done "failed" (its
# error event is counted under the error's code).
CLEAN = ("stage_unavailable", "quota_unavailable", "UNAVAILABLE", "HTTP 503")


def _replica_pids() -> dict[str, int]:
    from ray.util.state import list_actors

    pids = {}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], limit=1000):
        name = actor["class_name"]
        if name.startswith("ServeReplica:omniray:"):
            pids[name.rsplit(":", 1)[1]] = actor["pid"]
    return pids


def _rss_mib(pid: int) -> float:
    """A replica's resident memory with its children (the engine core process of a thinker)."""
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def _faults(cluster, run_s: float, log: list) -> None:
    time.sleep(run_s / 3)
    pid = _replica_pids()["Vocoder"]
    os.kill(pid, signal.SIGKILL)
    log.append({"at_s": round(run_s / 3), "fault": "vocoder replica SIGKILL", "pid": pid})
    time.sleep(run_s / 3)
    os.kill(cluster.redis_pid, signal.SIGKILL)
    time.sleep(5)
    cluster.redis_pid = runtime.start_redis(cluster.redis_port, cluster.run_dir).pid
    cluster.save()
    log.append({"at_s": round(2 * run_s / 3), "fault": "redis SIGKILL, restarted empty after 5 s"})


def _failures(prefix: Path) -> tuple[list[dict], list[dict]]:
    with open(f"{prefix}_failures.csv") as f:
        rows = list(csv.DictReader(f))
    clean = [r for r in rows if r["Error"].endswith("'failed')") or any(c in r["Error"] for c in CLEAN)]
    return clean, [r for r in rows if r not in clean]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--spawn-rate", type=float, default=1.0)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warm-up-minutes", type=float, default=5.0)
    args = ap.parse_args(argv)
    args.run_time = f"{int(args.minutes * 60)}s"
    run_s = args.minutes * 60
    out = results.folder("soak")
    prefix = out / "locust"
    os.environ.setdefault("OMNIRAY_TENANTS_FILE", str(TENANTS))
    model = load_profile(args.profile).served_model_name
    run_dir = out / "run"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cluster = runtime.start(
        args.profile, http_port=runtime.free_port(), grpc_port=runtime.free_port(), run_dir=run_dir
    )
    faults: list = []
    rss: dict[str, dict] = {}
    try:
        import ray

        ray.init(address=cluster.ray_address, log_to_driver=False)
        warm_up(cluster.http_url, model)
        env = {**os.environ, "LOADTEST_MODEL": model, "LOADTEST_GRPC_TARGET": cluster.grpc_target}
        locust = subprocess.Popen(locust_command(args, cluster.http_url, prefix), env=env)
        injector = threading.Thread(target=_faults, args=(cluster, run_s, faults), daemon=True)
        injector.start()
        time.sleep(args.warm_up_minutes * 60)
        pids = {k: v for k, v in _replica_pids().items() if k in MEASURED}
        rss = {k: {"pid": pid, "warm_mib": _rss_mib(pid)} for k, pid in pids.items()}
        rc = locust.wait(timeout=run_s + 300)
        for entry in rss.values():
            entry["end_mib"] = _rss_mib(entry["pid"])
            entry["growth"] = entry["end_mib"] / entry["warm_mib"] - 1
    finally:
        runtime.stop(run_dir)
    clean, lost = _failures(prefix)
    with open(f"{prefix}_stats.csv") as f:
        total = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    summary = {
        "command": shlex.join(["python", "-m", "loadtest.locustfiles.soak", *(argv or sys.argv[1:])]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "profile": args.profile,
        "users": args.users,
        "minutes": args.minutes,
        "locust_exit_code": rc,
        "requests": int(total["Request Count"]),
        "failures": int(total["Failure Count"]),
        "clean_errors": sum(int(r["Occurrences"]) for r in clean),
        "lost": sum(int(r["Occurrences"]) for r in lost),
        "lost_kinds": lost,
        "clean_kinds": clean,
        "faults": faults,
        "rss": rss,
    }
    results.write_summary(out, summary)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("clean_kinds",)}, indent=2))
    print(f"[soak] results in {out}")
    ok = summary["requests"] and not summary["lost"] and all(e["growth"] < 0.10 for e in rss.values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
