"""Replica faults for tests on a running cluster: find a Serve replica's process, kill it (and the
engine it started) as a node failure would, stream an answer while it happens, and read the counters
that say what the gateway did; roll a deployment by a change to its config. Used by tests/e2e/faults
(the `tiny` deployment) and tests/e2e_qwen3_omni."""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import signal
import threading
import time
import urllib.request

import httpx
import numpy as np
import psutil
import websockets.sync.client as ws_client

from services.common import shm
from services.quota import LOCAL_API_KEY
from tests.conftest import AUTH

PCM_RATE = 24_000

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


class RealtimeClient:
    """A realtime session answering in text, its turns a second of tone (no server VAD)."""

    def __init__(self, http_url: str, model: str):
        url = f"{http_url.replace('http', 'ws', 1)}/v1/realtime?model={model}"
        self.conn = ws_client.connect(url, additional_headers={"Authorization": f"Bearer {LOCAL_API_KEY}"})
        self.send({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 2000, "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}}}})  # fmt: skip
        self.wait("session.updated")

    def send(self, event: dict) -> None:
        self.conn.send(json.dumps(event))

    def wait(self, kind: str, timeout: float = 60, seen: list | None = None) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            event = json.loads(self.conn.recv(timeout=max(0.1, deadline - time.monotonic())))
            if seen is not None:
                seen.append((time.monotonic(), event))
            if event["type"] == kind:
                return event

    def turn(self) -> None:
        t = np.arange(PCM_RATE) / PCM_RATE
        pcm = (np.sin(2 * np.pi * 180 * t) * 8000).astype("<i2").tobytes()
        self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        self.send({"type": "input_audio_buffer.commit"})
        self.send({"type": "response.create"})


def counter(metrics_url: str, name: str, **labels: str) -> float:
    """A counter's sum over the series with these labels (every replica's)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        scrape = resp.read().decode()
    found = re.findall(rf"^ray_{name}\{{([^}}]*)\}} ([0-9.e+]+)", scrape, re.M)
    return sum(float(v) for tags, v in found if all(f'{k}="{x}"' in tags for k, x in labels.items()))


def resumes(metrics_url: str, **labels: str) -> float:
    """Responses resumed after their decode was lost (`omniray_gateway_decode_resumes_total`)."""
    return counter(metrics_url, "omniray_gateway_decode_resumes_total", outcome="resumed", **labels)
