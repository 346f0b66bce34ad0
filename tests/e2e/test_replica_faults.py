"""A stage replica's process dies in the middle of streamed responses: every client gets a clean
error within 5 s — REST an SSE error chunk then `[DONE]`, gRPC UNAVAILABLE, realtime an `error`
event and `response.done` with status `failed` — never a hang; once Serve has replaced the replica,
the next request and the same realtime session's next turn are served."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time

import grpc
import httpx
import numpy as np
import psutil
import pytest
import websockets.sync.client as ws_client
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc

from services.quota import LOCAL_API_KEY
from tests.conftest import AUTH, grpc_channel

PCM_RATE = 24_000
DETECT_S = 5.0  # the bound: a clean error within 5 s of the replica's death
RECOVER_S = 240.0  # Serve starts a new replica (its vLLM engine) well within this on 2 cores


def _replica_pid(stage: str) -> int:
    from ray.util.state import list_actors

    (actor,) = list_actors(
        filters=[("class_name", "=", f"ServeReplica:omniray:{stage}"), ("state", "=", "ALIVE")]
    )
    return actor["pid"]


def _kill(pid: int) -> None:
    """SIGKILL the replica and what it started (its vLLM engine core), as a node failure would."""
    proc = psutil.Process(pid)
    children = proc.children(recursive=True)
    os.kill(pid, signal.SIGKILL)
    for child in children:
        child.kill()


class _Outcome:
    def __init__(self):
        self.error_at: float | None = None
        self.detail = ""
        self.started = threading.Event()


def _rest_stream(omniray, model_name, out: _Outcome) -> None:
    body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000,
            "temperature": 0, "stream": True}  # fmt: skip
    with httpx.stream(
        "POST", f"{omniray.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as r:
        lines = []
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:
                    out.error_at, out.detail = time.monotonic(), json.dumps(event)
                elif event.get("choices") and event["choices"][0]["delta"].get("content"):
                    out.started.set()
            lines.append(line)
        out.detail += f" | last: {next((x for x in reversed(lines) if x), None)}"


def _grpc_stream(omniray, model_name, out: _Outcome) -> None:
    channel = grpc_channel(omniray.grpc_target)
    request = omni_pb2.ChatRequest(
        model=model_name,
        messages=[omni_pb2.Message(role="user", content=[omni_pb2.ContentPart(text="hi")])],
        sampling=common_pb2.SamplingParams(max_tokens=2000, temperature=0),
    )
    try:
        for chunk in omni_pb2_grpc.OmniStub(channel).Chat(request, timeout=60):
            if chunk.text:
                out.started.set()
    except grpc.RpcError as e:
        out.error_at, out.detail = time.monotonic(), f"{e.code().name}: {e.details()}"
    finally:
        channel.close()


class _Realtime:
    def __init__(self, omniray, model_name):
        url = f"{omniray.http_url.replace('http', 'ws', 1)}/v1/realtime?model={model_name}"
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


def test_decode_replica_dies_mid_stream(omniray, ray_driver, model_name):
    rest, rpc = _Outcome(), _Outcome()
    rt = _Realtime(omniray, model_name)
    rt.turn()
    rt.wait("response.output_text.delta")
    threads = [
        threading.Thread(target=_rest_stream, args=(omniray, model_name, rest)),
        threading.Thread(target=_grpc_stream, args=(omniray, model_name, rpc)),
    ]
    for t in threads:
        t.start()
    assert rest.started.wait(30) and rpc.started.wait(30), "the streams did not start"

    killed_at = time.monotonic()
    _kill(_replica_pid("Decode"))

    seen: list = []
    rt.wait("response.done", timeout=DETECT_S + 5, seen=seen)
    for t in threads:
        t.join(DETECT_S + 30)
        assert not t.is_alive(), "a client hung after the replica died"
    errors = [(at, e) for at, e in seen if e["type"] == "error"]
    done = seen[-1][1]
    print(f"\n[replica-faults] decode killed: REST error after {rest.error_at - killed_at:.2f} s, "
          f"gRPC after {rpc.error_at - killed_at:.2f} s, realtime after {seen[-1][0] - killed_at:.2f} s")  # fmt: skip

    # REST: an error chunk, then [DONE]; OpenAI-shaped, our words only
    assert rest.error_at is not None and rest.error_at - killed_at <= DETECT_S, rest.detail
    assert '"code": "stage_unavailable"' in rest.detail and "last: data: [DONE]" in rest.detail, rest.detail
    # gRPC: UNAVAILABLE
    assert rpc.error_at is not None and rpc.error_at - killed_at <= DETECT_S, rpc.detail
    assert rpc.detail.startswith("UNAVAILABLE"), rpc.detail
    # realtime: an error event, then response.done with status failed; the session goes on
    assert errors and errors[0][1]["error"]["code"] == "stage_unavailable", errors
    assert done["response"]["status"] == "failed" and seen[-1][0] - killed_at <= DETECT_S, done
    for detail in (rest.detail, rpc.detail, json.dumps(errors)):
        assert "Traceback" not in detail and "ActorID" not in detail and "ray::" not in detail

    # Serve replaces the replica: the next request, and the same session's next turn, are served.
    served: list = []
    waiter = threading.Thread(target=lambda: served.append(_served_again(omniray, model_name)))
    waiter.start()
    while waiter.is_alive():  # the session's user is still there meanwhile (no idle timeout)
        rt.send({"type": "input_audio_buffer.clear"})
        rt.wait("input_audio_buffer.cleared")
        waiter.join(5)
    assert served == [200], served
    print(f"[replica-faults] served again {time.monotonic() - killed_at:.0f} s after the kill")
    rt.turn()
    assert rt.wait("response.done", timeout=120)["response"]["status"] == "completed"
    rt.conn.close()


def _served_again(omniray, model_name) -> int:
    """The status of the first chat answered other than 503 (Serve may hold requests until a replica
    is back, or refuse them meanwhile)."""
    deadline = time.monotonic() + RECOVER_S
    while True:
        r = httpx.post(
            f"{omniray.http_url}/v1/chat/completions",
            json={"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers=AUTH,
            timeout=RECOVER_S,
        )
        if r.status_code != 503 or time.monotonic() > deadline:
            return r.status_code
        assert r.json()["error"]["code"] == "stage_unavailable", r.text
        time.sleep(2)


@pytest.fixture(autouse=True)
def _healthy_after(omniray):
    """Whatever happened, later tests find a serving system."""
    yield
    deadline = time.monotonic() + RECOVER_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{omniray.http_url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(2)
