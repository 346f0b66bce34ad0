"""Slow, vanishing and idle clients, and tenants that must not see each other, against the running
`tiny` system: a stalled body gets a 408; a client that leaves mid-stream leaves no engine work and
no debited quota behind; an idle realtime session is told and closed; one tenant's prompts are not
cached for another."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid

import httpx
import pytest
import redis.asyncio as aioredis
import websockets.sync.client as ws_client
from ray import serve
from websockets.exceptions import ConnectionClosedOK

from services.models.profile import load_profile
from services.quota import LOCAL_API_KEY
from services.quota.tenants import Limits, TenantSpec, put_tenant

TINY = load_profile("tiny")


def _tenant(omniray, **kw) -> str:
    """A fresh tenant in the cluster's Redis; returns its API key."""
    key = f"sk-test-{uuid.uuid4().hex}"

    async def put():
        client = aioredis.Redis.from_url(omniray.redis_url)
        try:
            await put_tenant(client, TenantSpec(id=f"t-{uuid.uuid4().hex[:8]}", **kw), [key])
        finally:
            await client.aclose()

    asyncio.run(put())
    return key


def _body(model, content="hi", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _raw_request(omniray, body: bytes, declared: int) -> socket.socket:
    host, port = omniray.http_url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {LOCAL_API_KEY}\r\ncontent-length: {declared}\r\n\r\n".encode()
        + body
    )
    return s


@pytest.mark.parametrize("sent", [0, 20], ids=["no_body", "partial_body"])
def test_stalled_body_gets_408(omniray, model_name, sent):
    body = json.dumps(_body(model_name)).encode()
    t0 = time.monotonic()
    with _raw_request(omniray, body[:sent], declared=len(body)) as s:
        head = b""
        while b'"}}' not in head and (part := s.recv(65536)):  # headers, then the JSON error body
            head += part
        head = head.decode(errors="replace")
    waited = time.monotonic() - t0
    assert head.startswith("HTTP/1.1 408"), head[:300]
    assert '"code":"request_timeout"' in head.replace(" ", "")
    limit = TINY.limits.body_read_timeout_s
    assert limit - 1 <= waited <= limit + 10, waited


def test_client_leaving_mid_stream_aborts_engine_work_and_releases_quota(omniray, ray_driver, model_name):
    # 3000 text tokens a minute (50/s refill): a 2000-token request takes two thirds of it.
    key = _tenant(omniray, per_minute=Limits(text_tokens=3000), burst_s=60)
    decode = serve.get_deployment_handle("Decode", app_name="omniray")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=omniray.http_url, timeout=60, headers=headers) as http:
        with http.stream(
            "POST",
            "/v1/chat/completions",
            json=_body(model_name, max_tokens=2000, stream=True, temperature=0),
        ) as r:
            assert r.status_code == 200
            before = int(r.headers["x-ratelimit-remaining-text-tokens"])
            lines = r.iter_lines()  # held open: leaving a `for` over it would close the response
            tokens = 0
            while tokens < 3:  # a few tokens, then leave
                line = next(lines)
                if line.startswith("data: {"):
                    chunk = json.loads(line.removeprefix("data: "))
                    tokens += bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
            assert decode.unfinished_requests.remote().result() == 1
        left = time.monotonic()  # the connection is closed here
        while (n := decode.unfinished_requests.remote().result()) and time.monotonic() - left < 10:
            time.sleep(0.05)
        aborted_after = time.monotonic() - left
        assert n == 0
        # 2000 tokens take tiny's engine ~2.5 s alone: gone at once means aborted, not finished
        assert aborted_after < 1.0, aborted_after
        after = http.post("/v1/chat/completions", json=_body(model_name))
        assert after.status_code == 200
        remaining = int(after.headers["x-ratelimit-remaining-text-tokens"])
    assert before < 1200  # 2000 tokens were taken up front...
    assert remaining > 2500, (before, remaining)  # ...and what was not generated came back
    print(f"\n[client-faults] engine request gone {aborted_after * 1000:.0f} ms after the client left")


def test_idle_realtime_session_is_told_and_closed(omniray, model_name):
    url = f"{omniray.http_url.replace('http', 'ws', 1)}/v1/realtime?model={model_name}"
    conn = ws_client.connect(url, additional_headers={"Authorization": f"Bearer {LOCAL_API_KEY}"})
    assert json.loads(conn.recv(timeout=30))["type"] == "session.created"
    t0 = time.monotonic()
    event = json.loads(conn.recv(timeout=TINY.realtime.idle_timeout_s + 30))
    waited = time.monotonic() - t0
    assert event["type"] == "error" and event["error"]["code"] == "session_idle_timeout", event
    with pytest.raises(ConnectionClosedOK):  # then closed by the server
        conn.recv(timeout=10)
    assert conn.close_code == 1000
    assert TINY.realtime.idle_timeout_s - 1 <= waited <= TINY.realtime.idle_timeout_s + 10


def test_prefix_cache_is_per_tenant(omniray, ray_driver, model_name):
    """vLLM's prefix cache (cache_salt) and the KV store are salted with the tenant: the same long
    prompt is served from cache for the tenant that sent it, and never for another. Read on the
    prefill engine, which computes a prompt or finds it (in its prefix cache, or loaded from the
    store): the decode engine loads each request's own prefill from the store when its pages are
    there in time, which counts as found too, for any tenant."""
    prompt = " ".join(f"word{i}" for i in range(600))  # well over one 128-token KV block
    a, b = _tenant(omniray), _tenant(omniray)
    prefill, decode = (
        serve.get_deployment_handle(name, app_name="omniray") for name in ("Prefill", "Decode")
    )

    def reused() -> float:
        """Prompt tokens the prefill engine did not compute, once both engines are idle (the
        counters are global: another test's work still running would count too) and its count
        settles (it is recorded a little after the request)."""
        last, now, deadline = -1.0, 0.0, time.monotonic() + 120
        while now != last:
            assert time.monotonic() < deadline, "the engines did not go idle and settle within 120 s"
            time.sleep(1.5)
            if prefill.unfinished_requests.remote().result() or decode.unfinished_requests.remote().result():
                continue
            sources = prefill.prompt_token_sources.remote().result()
            last, now = now, sources.get("local_cache_hit", 0) + sources.get("external_kv_transfer", 0)
        return now

    def reused_by(key: str) -> float:
        before = reused()
        r = httpx.post(
            f"{omniray.http_url}/v1/chat/completions",
            json=_body(model_name, prompt, max_tokens=1),
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        return reused() - before

    assert reused_by(a) == 0  # a tenant's first prompt is computed
    assert reused_by(a) > 0  # the tenant's own prefix is reused
    assert reused_by(b) == 0  # another tenant's is not
