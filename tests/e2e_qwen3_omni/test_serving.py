"""`qwen3-omni-tiny` through Serve — the GPU profile's stages, engine arguments and KV hand-off with
the real Qwen3-Omni at a tiny size: the official `openai` SDK streams an answer to text, an image and
speech (the model's own encoders in the encoder pool, their outputs placed by vLLM's thinker), a long
multimodal prompt goes through prefill -> decode over the KV store and is found there the next time,
gRPC Chat answers, and what is not wired yet (speech out) is refused with a clear 400."""

from __future__ import annotations

import base64

import openai
import pytest
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc
from openai import OpenAI

from services.quota import LOCAL_API_KEY
from tests.conftest import data_url, grpc_channel, local_cluster, png_bytes, wav_bytes

MODEL = "qwen3-omni-tiny"


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(MODEL) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    return OpenAI(base_url=f"{cluster.http_url}/v1", api_key=LOCAL_API_KEY, timeout=120, max_retries=0)


def test_the_sdk_streams_an_answer(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is in Paris?"},
        ],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = next(c.usage for c in chunks if c.usage)
    assert text and usage.completion_tokens == 16 and usage.prompt_tokens > 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]


def test_grpc_chat_answers(cluster):
    stub = omni_pb2_grpc.OmniStub(grpc_channel(cluster.grpc_target))
    request = omni_pb2.ChatRequest(
        model=MODEL,
        messages=[omni_pb2.Message(role="user", content=[omni_pb2.ContentPart(text="hello")])],
        sampling=common_pb2.SamplingParams(max_tokens=8),
    )
    chunks = list(stub.Chat(request, timeout=120))
    assert "".join(c.text for c in chunks) and chunks[-1].finish_reason == "length"


def _media_question(image: bytes, detail: str = "auto") -> list[dict]:
    speech = base64.b64encode(wav_bytes(seconds=1.5)).decode()
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is in the picture, and what do you hear?"},
            {"type": "image_url", "image_url": {"url": data_url(image), "detail": detail}},
            {"type": "input_audio", "input_audio": {"data": speech, "format": "wav"}},
        ]},
    ]  # fmt: skip


def _answer(client, messages, **extra):
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, **extra,
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, next(c.usage for c in chunks if c.usage)


def test_the_sdk_sends_text_an_image_and_speech(client):
    text, usage = _answer(client, _media_question(png_bytes(width=300, height=200, seed=11)))
    # image: the processor's grid for 300x200 within one tile; audio: 13 tokens a second
    assert text and usage.completion_tokens == 12 and usage.prompt_tokens > 60 + 19


def test_a_long_multimodal_prompt_goes_through_prefill_and_the_kv_store(client):
    """A 2x2-tile image (4 x 196 tokens) passes disagg_min_prompt_tokens: prefill computes the KV,
    decode loads it from the store; asked again, the pages are found (vLLM's cached tokens) and the
    greedy answer is the same."""
    messages = _media_question(png_bytes(width=896, height=896, seed=12), detail="high")
    first, u1 = _answer(client, messages)
    again, u2 = _answer(client, messages)
    assert u1.prompt_tokens > 4 * 196 and u2.prompt_tokens == u1.prompt_tokens
    assert again == first
    assert u2.prompt_tokens_details.cached_tokens >= 4 * 196


def test_speech_out_is_refused_until_wired(cluster, client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            modalities=["text", "audio"], audio={"voice": "default", "format": "pcm16"},
        )  # fmt: skip
