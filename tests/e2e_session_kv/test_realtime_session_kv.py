"""Session KV through the gateway (docs/realtime.md, "Session KV"): on a tiny deployment whose decode
engine keeps sinks + window (`engine.sink_window`) and a long-lived request per session
(`engine.session_kv`), a realtime session's text turns reach the decode replica as turns of one
vLLM request, and the engine's KV pool holds no more than that request's bound while the
conversation grows far past it. Its own cluster (another profile than tests/e2e's), outside that
package so the two never run at once on two cores."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest
import yaml

from loadtest.clients.realtime_client import RealtimeClient
from services.extensions.vllm import sink_window
from services.models.profile import CONFIG_DIR
from services.realtime.server_events import WHOLE
from tests.conftest import local_cluster

SINKS, WINDOW, BLOCK, POOL = 32, 64, 32, 128
MAX_MODEL_LEN = 2048  # the pool (and the prefill engine's full KV) holds one request of this length
TURNS = 12


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    raw = yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text())
    raw["engine"].update({
        "kv_transfer": "none", "block_size": BLOCK, "max_model_len": MAX_MODEL_LEN,
        "sink_window": {"sink_tokens": SINKS, "window_tokens": WINDOW},
        "session_kv": {"max_sessions": 4, "idle_s": 600},
        "extra": {**raw["engine"].get("extra", {}), "num_gpu_blocks_override": POOL},
    })  # fmt: skip
    path = tmp_path_factory.mktemp("profile") / "tiny-session-kv.yaml"
    path.write_text(yaml.safe_dump(raw))
    with local_cluster(str(path)) as cluster:
        yield cluster


def _samples(cluster, name: str) -> list[tuple[str, float]]:
    """(labels, value) of a metric in the cluster's Prometheus scrape (one per process and labels)."""
    with urllib.request.urlopen(cluster.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    return [(m[1], float(m[2])) for m in re.finditer(rf"^ray_{name}\{{([^}}]*)\}} (\S+)$", text, re.M)]


def _turns(cluster) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in _samples(cluster, "omniray_engine_session_kv_turns_total"):
        outcome = re.search(r'outcome="([^"]+)"', labels)[1]
        out[outcome] = out.get(outcome, 0.0) + value
    return out


def test_a_realtime_conversation_is_one_request_within_the_bound(bounded):
    r = RealtimeClient(f"{bounded.http_url.replace('http', 'ws', 1)}/v1/realtime?model=omniray-tiny")
    try:
        r.wait("session.created")
        r.send({"type": "session.update", "session": {
            "type": "realtime", "output_modalities": ["text"], "max_output_tokens": 16}})  # fmt: skip
        r.wait("session.updated")
        for n in range(TURNS):
            text = f"Turn {n}: tell me more about the sea, the sky and the hills beyond them."
            r.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": text}]}})  # fmt: skip
            r.wait("conversation.item.done")
            at = r.mark()
            r.send({"type": "response.create"})
            done = r.event(r.wait("response.done", at))["response"]
            assert done["status"] in WHOLE, done
            prompt_tokens = done["usage"]["input_tokens"]
    finally:
        r.close()
    assert prompt_tokens > 2 * (SINKS + WINDOW)  # the conversation grew far past what the engine keeps
    deadline = time.monotonic() + 60  # Ray exports metrics every few seconds
    while sum((turns := _turns(bounded)).values()) < TURNS and time.monotonic() < deadline:
        time.sleep(1)
    # every turn reached the session's request: the first started it, later ones continued it
    # (or restarted it windowed, where the history renders a reply to other text)
    assert turns.get("started") == 1 and turns.get("one_off", 0) == 0, turns
    assert turns.get("appended", 0) >= TURNS // 2, turns
    bound = sink_window.max_resident_blocks(BLOCK, SINKS, WINDOW)
    engine = [
        v for labels, v in _samples(bounded, "omniray_kv_pool_occupancy_ratio") if 'tier="engine"' in labels
    ]
    assert engine and max(engine) * (POOL - 1) <= bound + 0.5, engine  # vLLM's pool keeps one null block
