"""One trace per request across the gateway, the router, the quota and every stage: a chat request
with an image, a prompt long enough for the prefill stage and audio out, sent with the client's own
`traceparent`, is exported by every replica process (OTLP) to the test's receiver as one trace."""

from __future__ import annotations

import secrets

import httpx

from tests.conftest import AUTH, data_url, png_bytes

STAGE_SPANS = {"encoder.encode", "prefill.prefill", "decode.decode", "talker.talk", "vocoder.vocode"}
# The prompt reaches the prefill stage at profile.engine.disagg_min_prompt_tokens (512 in tiny).
LONG_TEXT = " ".join(f"word{i % 50}" for i in range(400))


def test_chat_with_audio_out_is_one_trace_across_gateway_router_quota_and_stages(
    omniray, otlp_receiver, model_name
):
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    body = {
        "model": model_name,
        "max_tokens": 12,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "default", "format": "pcm16"},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": LONG_TEXT},
                    {"type": "image_url", "image_url": {"url": data_url(png_bytes())}},
                ],
            }
        ],
    }
    headers = {**AUTH, "traceparent": f"00-{trace_id}-{client_span}-01"}
    r = httpx.post(f"{omniray.http_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["audio"]["data"]

    wanted = {"gateway.chat", "gateway.prepare", "router.plan", "router.choose_replica", "quota.admit"}
    wanted |= STAGE_SPANS

    def names(spans):
        return {s.name for s in spans if s.trace_id == trace_id}

    spans = [s for s in otlp_receiver.wait_for(lambda ss: wanted <= names(ss), 30) if s.trace_id == trace_id]
    assert wanted <= {s.name for s in spans}, wanted - {s.name for s in spans}
    # One tree: the request span is the client's child, every other span's parent is in the trace.
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in spans if s.name == "gateway.chat"]
    assert root.parent_span_id == client_span
    for s in spans:
        if s is not root:
            assert s.parent_span_id in by_id, (s.name, s.parent_span_id)
    assert len({s.attributes["omniray.request_id"] for s in spans if s.name in STAGE_SPANS}) == 1
    assert root.attributes["omniray.audio_seconds"] > 0
