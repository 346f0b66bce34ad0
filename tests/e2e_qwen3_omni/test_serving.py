"""`qwen3-omni-tiny` through Serve — the GPU profile's stages, engine arguments and KV hand-off with
the real Qwen3-Omni thinker at a tiny size: the official `openai` SDK streams an answer, gRPC Chat
answers, and what is not wired yet (media in, speech out) is refused with a clear 400."""

from __future__ import annotations

import httpx
import openai
import pytest
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc
from openai import OpenAI

from services.quota import LOCAL_API_KEY
from tests.conftest import AUTH, data_url, grpc_channel, local_cluster, png_bytes

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


def test_media_in_and_speech_out_are_refused_until_wired(cluster, client):
    image = {"type": "image_url", "image_url": {"url": data_url(png_bytes(seed=3))}}
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [image]}]}
    r = httpx.post(f"{cluster.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"], r.text
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            modalities=["text", "audio"], audio={"voice": "default", "format": "pcm16"},
        )  # fmt: skip
