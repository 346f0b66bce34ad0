"""Quotas through the real gateway (Serve, REST and gRPC): 401 without a valid key, 429 with
Retry-After and x-ratelimit headers, RESOURCE_EXHAUSTED over gRPC, a batch request that waits for
budget and then completes."""

from __future__ import annotations

import time

import grpc
import httpx
import pytest
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc

from services.quota.tenants import Limits
from tests.conftest import grpc_channel, new_tenant


def _post(omniray, key, **extra):
    body = {"model": "omniray-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(extra.pop("headers", {}))
    body.update(extra)
    return httpx.post(f"{omniray.http_url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def test_missing_or_unknown_key_is_401(omniray):
    for key in (None, "sk-not-a-key"):
        r = _post(omniray, key)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_over_budget_interactive_gets_429_with_headers(omniray):
    # 40 text tokens a minute: the first request (prompt + 4 max tokens) fits, a 200-token one never does,
    # and a burst runs the bucket dry.
    key = new_tenant(omniray, per_minute=Limits(text_tokens=40))
    ok = _post(omniray, key)
    assert ok.status_code == 200, ok.text
    assert ok.headers["x-ratelimit-limit-text-tokens"] == "40"
    remaining = int(ok.headers["x-ratelimit-remaining-text-tokens"])
    assert remaining < 40
    never = _post(omniray, key, max_tokens=200)
    assert never.status_code == 429 and never.json()["error"]["code"] == "request_exceeds_quota"
    statuses = [_post(omniray, key).status_code for _ in range(8)]
    assert 429 in statuses
    r = next(r for r in (_post(omniray, key) for _ in range(8)) if r.status_code == 429)
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-reset-text-tokens"].endswith("s")
    assert r.json()["error"]["type"] == "rate_limit_error"


def test_grpc_unauthenticated_and_resource_exhausted(omniray):
    req = omni_pb2.ChatRequest(
        model="omniray-tiny",
        messages=[omni_pb2.Message(role="user", content=[omni_pb2.ContentPart(text="hi")])],
        sampling=common_pb2.SamplingParams(max_tokens=4),
    )
    with pytest.raises(grpc.RpcError) as e:
        list(omni_pb2_grpc.OmniStub(grpc_channel(omniray.grpc_target, key=None)).Chat(req, timeout=60))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    key = new_tenant(omniray, per_minute=Limits(text_tokens=20))
    stub = omni_pb2_grpc.OmniStub(grpc_channel(omniray.grpc_target, key=key))
    codes = []
    for _ in range(6):
        try:
            list(stub.Chat(req, timeout=60))
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as err:
            codes.append(err.code())
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                message, _, fields = err.details().rpartition(" [")
                assert "budget" in message
                info = dict(kv.split("=", 1) for kv in fields.rstrip("]").split("; "))
                assert int(info["retry-after"]) >= 1
                assert "x-ratelimit-remaining-text-tokens" in info
                break
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes


def test_batch_request_waits_for_budget_then_completes(omniray):
    # 1200 tokens/min = 20 per second. Interactive requests of ~41 tokens drain the bucket to below 41;
    # a ~61-token batch request then has to wait at least a second for budget, and gets it.
    key = new_tenant(omniray, per_minute=Limits(text_tokens=1200), max_class="interactive")
    while _post(omniray, key, max_tokens=40).status_code == 200:
        pass
    t0 = time.monotonic()
    r = _post(omniray, key, max_tokens=60, headers={"x-omniray-slo-class": "batch"})
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 > 0.9  # it waited for budget instead of a 429
    flex = _post(omniray, key, max_tokens=60, service_tier="flex")  # OpenAI's tier maps to batch
    assert flex.status_code == 200, flex.text


def test_a_realtime_response_tells_the_tenants_rate_limits(omniray):
    """`rate_limits.updated` after `response.created`: what the tenant's budgets hold after admitting
    the response (OpenAI's "tokens" is the text-token budget)."""
    import json

    from websockets.sync.client import connect

    key = new_tenant(omniray, per_minute=Limits(text_tokens=100_000))
    url = omniray.http_url.replace("http", "ws") + "/v1/realtime?model=omniray-tiny"
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
                                                                  "audio": {"input": {"turn_detection": None}}}}))  # fmt: skip
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                         "content": [{"type": "input_text", "text": "hi"}]}}))  # fmt: skip
        ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 4}}))
        kinds, limits = [], None
        while "response.done" not in kinds:
            event = json.loads(ws.recv(timeout=60))
            kinds.append(event["type"])
            if event["type"] == "rate_limits.updated":
                limits = event["rate_limits"]
    assert kinds.index("rate_limits.updated") == kinds.index("response.created") + 1
    (tokens,) = [x for x in limits if x["name"] == "tokens"]
    assert tokens["limit"] == 100_000 and 0 < tokens["remaining"] < 100_000 and tokens["reset_seconds"] >= 0
