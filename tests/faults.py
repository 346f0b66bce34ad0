"""Replica faults for tests on a running cluster: find a Serve replica's process, kill it (and the
engine it started) as a node failure would, stream an answer while it happens, and read the counters
that say what the gateway did; roll a deployment by a change to its config. Used by tests/e2e/faults
(the `tiny` deployment) and tests/e2e_qwen3_omni."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import threading
import time
import urllib.request

import httpx
import psutil

from services.common import shm
from tests.conftest import AUTH

# Past the profile's decode_resume.wait_s (240 s): a replacement that never comes fails, not hangs.
RECOVER_S = 300.0

# What vLLM's MessageQueue does in an engine process (`python -c SEGMENT_HOLDER`): a segment only
# its clean exit would unlink (no resource tracker does it for it either); prints its name, then waits.
SEGMENT_HOLDER = """
import time
from multiprocessing import resource_tracker, shared_memory
shm = shared_memory.SharedMemory(create=True, size=1 << 16)
resource_tracker.unregister(shm._name, "shared_memory")
print(shm.name, flush=True)
time.sleep(600)
"""


def replica_pid(stage: str) -> int:
    """The process of the stage's one live replica (needs this process joined to the cluster)."""
    from ray.util.state import list_actors

    (actor,) = list_actors(
        filters=[("class_name", "=", f"ServeReplica:omniray:{stage}"), ("state", "=", "ALIVE")]
    )
    return actor["pid"]


def rolled(config: dict, deployment: str) -> dict:
    """A copy of a deployed Serve config in which only `deployment`'s options changed (a hundredth
    of a CPU more): applied, Serve starts that deployment's new replicas and drains its old ones."""
    config = copy.deepcopy(config)
    (app,) = config["applications"]
    options = next(d for d in app["deployments"] if d["name"] == deployment)["ray_actor_options"]
    options["num_cpus"] = round(options["num_cpus"] + 0.01, 3)
    return config


def kill(pid: int) -> set[str]:
    """SIGKILL the replica and what it started (its vLLM engine core), as a node failure would.
    Returns the shared memory they mapped: what the engine's clean exit would have unlinked, and
    the replacement's start on this node does (services/common/shm.py)."""
    proc = psutil.Process(pid)
    children = proc.children(recursive=True)
    segments = shm.mapped([proc, *children])
    os.kill(pid, signal.SIGKILL)
    for child in children:
        child.kill()
    return segments


class Outcome:
    """What a client saw of one streamed answer."""

    def __init__(self):
        self.error_at: float | None = None
        self.detail = ""
        self.finish = ""
        self.tokens = 0  # completion tokens in the final usage
        self.text = ""
        self.audio: list[tuple[float, int]] = []  # (when, base64 length) of each audio delta
        self.transcript = ""
        self.started = threading.Event()


def rest_stream(http_url: str, model: str, out: Outcome, max_tokens: int, extra: dict | None = None) -> None:
    """A streamed chat completion, greedy, into `out` (run it in a thread)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}  # fmt: skip
    with httpx.stream("POST", f"{http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=300) as r:
        lines = []
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line.removeprefix("data: "))
                delta = event["choices"][0].get("delta") or {} if event.get("choices") else {}
                audio = delta.get("audio") or {}
                if "error" in event:
                    out.error_at, out.detail = time.monotonic(), json.dumps(event)
                elif event.get("usage"):
                    out.tokens = event["usage"]["completion_tokens"]
                elif event.get("choices") and event["choices"][0].get("finish_reason"):
                    out.finish = event["choices"][0]["finish_reason"]
                elif delta.get("content"):
                    out.text += delta["content"]
                    out.started.set()
                elif audio.get("data") or audio.get("transcript"):
                    if audio.get("data"):
                        out.audio.append((time.monotonic(), len(audio["data"])))
                    out.transcript += audio.get("transcript") or ""
                    out.started.set()
            lines.append(line)
        out.detail += f" | last: {next((x for x in reversed(lines) if x), None)}"


def counter(metrics_url: str, name: str, **labels: str) -> float:
    """A counter's sum over the series with these labels (every replica's)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        scrape = resp.read().decode()
    found = re.findall(rf"^ray_{name}\{{([^}}]*)\}} ([0-9.e+]+)", scrape, re.M)
    return sum(float(v) for tags, v in found if all(f'{k}="{x}"' in tags for k, x in labels.items()))


def resumes(metrics_url: str, **labels: str) -> float:
    """Responses resumed after their decode was lost (`omniray_gateway_decode_resumes_total`)."""
    return counter(metrics_url, "omniray_gateway_decode_resumes_total", outcome="resumed", **labels)
