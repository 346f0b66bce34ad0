"""Where the CPU goes during a benchmark round: CPU seconds of every process on the machine between
two snapshots, grouped by role (the gateway replica, the decode replica, a vLLM engine core or
worker and whose it is, vLLM's API server, Ray's own processes, ...)."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import psutil

from services.runtime import RUN_ID_ENV

# Serve replicas carry their deployment in the process title (ray::ServeReplica:<app>:<deployment>).
_REPLICA = "ray::ServeReplica:"


@dataclass(frozen=True)
class Snapshot:
    cpu_s: dict[int, float]  # pid -> user + system seconds
    label: dict[int, str]


def snapshot(roots: dict[int, str] | None = None, runs: dict[str, str] | None = None) -> Snapshot:
    """`roots`: pid -> label of process trees to name after their root (e.g. vLLM's server).
    `runs`: run id -> name of local runs on this machine at once (services/runtime.py tags each of
    their processes with OMNIRAY_RUN_ID): their processes' labels start with the run's name."""
    roots, runs = roots or {}, runs or {}
    procs = {}
    attrs = ["pid", "ppid", "name", "cmdline", "cpu_times"] + (["environ"] if runs else [])
    for p in psutil.process_iter(attrs):  # what cannot be read (another user's) comes as None
        info = p.info
        if info["cpu_times"] is None:
            continue
        procs[info["pid"]] = info
    cpu = {pid: i["cpu_times"].user + i["cpu_times"].system for pid, i in procs.items()}
    labels = {pid: _label(pid, procs, roots) for pid in procs}
    for pid, info in procs.items():
        if (run := runs.get((info.get("environ") or {}).get(RUN_ID_ENV))) is not None:
            labels[pid] = f"{run}: {labels[pid]}"
    return Snapshot(cpu, labels)


def _title(info: dict) -> str:
    cmd = info["cmdline"] or []
    return cmd[0] if len(cmd) == 1 else (info["name"] or "")


def _label(pid: int, procs: dict, roots: dict[int, str]) -> str:
    info = procs[pid]
    title = _title(info)
    own = title.removeprefix("VLLM::") if title.startswith("VLLM::") else None
    # An engine process is named after whoever started it (a replica, or a root such as vLLM's server).
    at, seen = pid, 0
    while at in procs and seen < 8:
        if at in roots:
            return roots[at] + (f"/{own}" if own else "")
        t = _title(procs[at])
        if t.startswith(_REPLICA):
            name = t.rsplit(":", 1)[-1].lower()
            return f"{name}/{own}" if own else f"{name} replica"
        at, seen = procs[at]["ppid"], seen + 1
    if title.startswith("ray::"):
        return "ray: " + title.removeprefix("ray::")
    name = os.path.basename((info["cmdline"] or [info["name"] or "?"])[0])
    return {"gcs_server": "ray: gcs", "raylet": "ray: raylet", "haproxy": "haproxy"}.get(name, "other")


def between(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per label spent from `before` to `after` (processes that started in between count
    from 0)."""
    out: Counter[str] = Counter()
    for pid, t in after.cpu_s.items():
        spent = t - before.cpu_s.get(pid, 0.0)
        if spent > 0:
            out[after.label[pid]] += spent
    return dict(out)
