"""The Serve application: gateway plus five stage deployments, autoscaling, the P/D KV hand-off,
async chunk ordering, and a model updated under running replicas (version skew)."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import random
import threading
import time
import urllib.request
import uuid

import httpx

from services import runtime
from services.app import DEPLOYMENT_NAMES
from services.models.build import MANIFEST, prepare
from services.models.profile import load_profile
from tests.conftest import AUTH, data_url, png_bytes
from tests.faults import counter, rolled

CLIENTS = 8  # concurrent clients, each request 8 fresh images (the encoder's target is 1 ongoing)
STAGES = {DEPLOYMENT_NAMES[stage] for stage in load_profile("tiny").stages}


def _app_status(omniray) -> dict:
    with urllib.request.urlopen(f"{omniray.dashboard_url}/api/serve/applications/", timeout=10) as r:
        return json.load(r)["applications"]["omniray"]


def _running_replicas(omniray, deployment: str) -> int:
    replicas = _app_status(omniray)["deployments"][deployment]["replicas"]
    return sum(r["state"] == "RUNNING" for r in replicas)


def test_gateway_and_stage_deployments(omniray):
    app = _app_status(omniray)
    assert app["status"] == "RUNNING"
    assert set(app["deployments"]) == STAGES
    assert all(d["status"] == "HEALTHY" for d in app["deployments"].values())
    # Each stage carries its own options from the profile.
    configs = {name: d["deployment_config"] for name, d in app["deployments"].items()}
    assert configs["Encoder"]["autoscaling_config"]["max_replicas"] == 2
    assert configs["Decode"]["max_ongoing_requests"] == 128


def _until_one_replica(omniray, deployment: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (n := _running_replicas(omniray, deployment)) > 1 and time.monotonic() < deadline:
        time.sleep(1)
    return n


def test_encoder_scales_up_under_load_and_back_down(omniray, model_name):
    # Earlier tests' images may have scaled it up: back down after downscale_delay_s (conftest).
    assert _until_one_replica(omniray, "Encoder", 90) == 1
    # Seeds no other test uses: an image encoded before would be a feature-cache hit, no encoder work.
    seeds = itertools.count(random.SystemRandom().randrange(1 << 40))

    def body():
        # Fresh images each time (the feature cache would answer repeats without encoder work);
        # 256 px: 2x2 tiles of 128 px, 8 x 4 x 64 = 2048 embeddings (fits the 4096 context).
        images = [
            {"type": "image_url", "image_url": {"url": data_url(png_bytes(256, 256, seed=next(seeds)))}}
            for _ in range(8)
        ]
        return {"model": model_name, "max_tokens": 1, "messages": [{"role": "user", "content": images}]}

    stop = threading.Event()
    codes: set[int] = set()

    def client():
        with httpx.Client(timeout=120, headers=AUTH) as c:
            while not stop.is_set():
                codes.add(c.post(f"{omniray.http_url}/v1/chat/completions", json=body()).status_code)

    # Steady load from CLIENTS clients while the status is watched every half second: waves of
    # requests would leave gaps (their stragglers) in which the controller scales back down.
    seen: list[tuple[int, list[str]]] = []  # (seconds into the load, replica states) as they changed
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        clients = [pool.submit(client) for _ in range(CLIENTS)]
        try:
            start = time.monotonic()
            deadline = start + 240  # the decision, then a fresh worker importing torch
            while time.monotonic() < deadline and not any(f.done() for f in clients):
                states = [r["state"] for r in _app_status(omniray)["deployments"]["Encoder"]["replicas"]]
                if not seen or states != seen[-1][1]:
                    seen.append((round(time.monotonic() - start), states))
                if states.count("RUNNING") >= 2:
                    break
                time.sleep(0.5)
        finally:
            stop.set()
        for f in clients:
            f.result()
    assert codes == {200}
    assert seen[-1][1].count("RUNNING") >= 2, f"encoder did not scale up under steady load: {seen[-10:]}"
    assert _until_one_replica(omniray, "Encoder", 120) == 1, "encoder did not scale back down when idle"


def test_decode_does_not_recompute_the_prompt(omniray, ray_driver, openai_client, model_name):
    """vLLM's own counter in the decode engine: prompt tokens that arrived as KV through the store."""
    from ray import serve

    decode = serve.get_deployment_handle("Decode", app_name="omniray")
    before = decode.prompt_token_sources.remote().result()
    # Unique: no earlier prompt (other tests share the cluster) may be in decode's own prefix cache.
    long_prompt = " ".join([uuid.uuid4().hex, *(f"word{i}" for i in range(400))])
    r = openai_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": long_prompt}], max_tokens=4, temperature=0
    )
    after = decode.prompt_token_sources.remote().result()
    external = after.get("external_kv_transfer", 0) - before.get("external_kv_transfer", 0)
    computed = after.get("local_compute", 0) - before.get("local_compute", 0)
    n = r.usage.prompt_tokens
    assert n > 512
    # The whole prompt, partial last page included, came from prefill's pages; decode computed none.
    assert external == n, (before, after, n)
    assert computed == 0, (before, after, n)


def test_decode_chunks_carry_the_engines_frame_time(omniray, ray_driver):
    """The frame time realtime admission reads (services/policies/admission.py): the decode
    engine's step period while busy, measured in its engine core, on the chunks it streams."""
    from omni.v1 import common_pb2, stages_pb2
    from ray import serve

    decode = serve.get_deployment_handle("Decode", app_name="omniray")
    ids = [random.randrange(5, 2000) for _ in range(40)]
    request = stages_pb2.DecodeRequest(
        ctx=common_pb2.RequestContext(request_id=uuid.uuid4().hex, tenant="local"),
        prompt=stages_pb2.Prompt(segments=[stages_pb2.PromptSegment(tokens=stages_pb2.TokenSpan(ids=ids))]),
        sampling=common_pb2.SamplingParams(max_tokens=48, temperature=0),
    )
    frames = [chunk.frame_ms for chunk in decode.options(stream=True).Decode.remote(request)]
    assert frames and 0 < max(frames) < 1000, frames


def test_first_audio_arrives_before_last_text_token(omniray, model_name):
    """Async chunk: the talker starts on the first text piece, not on the whole answer."""
    body = {
        "model": model_name,
        "max_tokens": 200,
        "temperature": 0,
        "stream": True,
        "modalities": ["text", "audio"],
        "audio": {"voice": "default", "format": "pcm16"},
        "messages": [{"role": "user", "content": "Talk for a while"}],
    }
    order = []
    with (
        httpx.Client(timeout=120, headers=AUTH) as c,
        c.stream("POST", f"{omniray.http_url}/v1/chat/completions", json=body) as r,
    ):
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            audio = choices[0]["delta"].get("audio", {}) if choices else {}
            if audio.get("transcript"):
                order.append("text")
            if audio.get("data"):
                order.append("audio")
    assert "audio" in order and "text" in order
    last_text = len(order) - 1 - order[::-1].index("text")
    assert order.index("audio") < last_text, order


def _mismatches(omniray) -> float:
    return counter(omniray.metrics_url, "omniray_encoder_feature_version_mismatch_total")


def test_stale_encoder_features_are_rejected_reencoded_counted(omniray, model_name):
    """Version skew: the vision model is updated on disk (the package's private copy) under a
    running encoder replica (v1 in memory) and a gateway starts that expects v2. Features from v1
    are rejected, counted, re-encoded at v2 (the replica reloads the model now on disk), and the
    request succeeds. The deployment is put back as it was after (the model stays at v2)."""
    # one encoder replica, so every image below meets the same one (earlier tests scale it up)
    assert _until_one_replica(omniray, "Encoder", 90) == 1
    seeds = itertools.count(random.SystemRandom().randrange(1 << 40))  # fresh: no feature-cache hit

    def ask() -> httpx.Response:
        image = {"type": "image_url", "image_url": {"url": data_url(png_bytes(128, 128, seed=next(seeds)))}}
        body = {"model": model_name, "max_tokens": 2, "messages": [{"role": "user", "content": [image]}]}
        return httpx.post(f"{omniray.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)

    assert ask().status_code == 200
    profile = load_profile("tiny")
    spec = profile.models.vision
    path = profile.model_path(spec)
    (path / MANIFEST).unlink()
    v2 = spec.model_copy(update={"options": spec.options.model_copy(update={"seed": 99})})
    assert prepare(v2, path)
    # Only the gateway restarts (its options changed) and now expects v2.
    deployed = runtime.applied(omniray)
    runtime.apply(omniray, rolled(deployed, "Gateway"))
    try:
        before = _mismatches(omniray)
        r = ask()
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60  # Ray exports metrics every few seconds
        while _mismatches(omniray) <= before and time.monotonic() < deadline:
            time.sleep(2)
        assert _mismatches(omniray) == before + 1
        # The replica now serves v2: no further mismatch.
        assert ask().status_code == 200
        time.sleep(8)
        assert _mismatches(omniray) == before + 1
    finally:
        runtime.apply(omniray, deployed)
