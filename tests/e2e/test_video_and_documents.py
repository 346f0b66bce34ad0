"""Video clips and PDFs on the shared tiny deployment: the official SDK sends `video_url` (mp4,
webm) and `file` (PDF) parts and gets answers; the key frames, the clip's audio track and the pages
reach the encoder (counted in the prompt: tiny's ViT gives 64 rows per frame or tile); the same over
Responses and gRPC."""

from __future__ import annotations

import base64

import httpx
import pytest
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc

from loadtest.clients.clips import pdf_document, video_clip
from services.quota import LOCAL_API_KEY
from tests.conftest import collect_audio, grpc_channel

ROWS = 64  # tiny ViT rows per tile (a key frame is one tile)


def _video_url(clip: bytes, mime: str = "video/mp4") -> str:
    return f"data:{mime};base64,{base64.b64encode(clip).decode()}"


def _ask(client, model, *parts, **kw):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What happens here?"}, *parts]}],
        max_tokens=8,
        temperature=0,
        **kw,
    )


@pytest.fixture(scope="module")
def text_only(openai_client, model_name) -> int:
    return _ask(openai_client, model_name).usage.prompt_tokens


@pytest.mark.parametrize(("container", "mime"), [("mp4", "video/mp4"), ("webm", "video/webm")])
def test_a_clip_is_answered_with_its_key_frames_in_the_prompt(
    openai_client, model_name, text_only, container, mime
):
    clip = video_clip(seconds=3, fps=10, size=(160, 120), container=container, motion="moving")
    r = _ask(openai_client, model_name, {"type": "video_url", "video_url": {"url": _video_url(clip, mime)}})
    assert r.choices[0].message.content
    frames = (r.usage.prompt_tokens - text_only - 1) // ROWS  # "\n" between the text and the clip
    assert frames == 6  # tiny samples 2 frames a second; every frame of a moving scene is a key frame


def test_a_static_scene_is_one_key_frame(openai_client, model_name, text_only):
    clip = video_clip(seconds=3, fps=10, size=(160, 120), motion="static")
    r = _ask(openai_client, model_name, {"type": "video_url", "video_url": {"url": _video_url(clip)}})
    assert (r.usage.prompt_tokens - text_only - 1) // ROWS == 1


def test_a_clip_sent_again_answers_the_same(openai_client, model_name):
    clip = video_clip(seconds=2, fps=10, size=(160, 120), motion="cuts", container="webm")
    part = {"type": "video_url", "video_url": {"url": _video_url(clip, "video/webm")}}
    first, again = (_ask(openai_client, model_name, part) for _ in range(2))
    assert first.choices[0].message.content == again.choices[0].message.content


def test_the_audio_track_is_heard_when_asked(openai_client, model_name):
    clip = video_clip(seconds=2, fps=10, size=(96, 64), motion="static", audio_hz=440)
    part = {"type": "video_url", "video_url": {"url": _video_url(clip)}}
    seen = _ask(openai_client, model_name, part).usage.prompt_tokens
    heard = _ask(
        openai_client, model_name, part, extra_body={"mm_processor_kwargs": {"use_audio_in_video": True}}
    ).usage.prompt_tokens
    assert heard > seen + 10  # the track's audio rows (tiny's encoder: 25 a second) and a newline


def test_a_clip_with_speech_out_streams_audio(openai_client, model_name):
    clip = video_clip(seconds=2, fps=10, size=(96, 64))
    stream = openai_client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": _video_url(clip)}}]}
        ],
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        max_tokens=8,
        stream=True,
    )
    assert len(collect_audio(stream).pcm) > 0


def _pdf_part(pages: int) -> dict:
    data = base64.b64encode(pdf_document(pages)).decode()
    return {
        "type": "file",
        "file": {"filename": "doc.pdf", "file_data": f"data:application/pdf;base64,{data}"},
    }


def test_a_pdf_is_answered_page_by_page(openai_client, model_name, text_only):
    one = _ask(openai_client, model_name, _pdf_part(1)).usage.prompt_tokens
    three = _ask(openai_client, model_name, _pdf_part(3))
    assert three.choices[0].message.content
    per_page = one - text_only
    assert per_page > ROWS  # a 918 x 1188 px page is many tiles at tiny's 128 px
    assert (
        three.usage.prompt_tokens - text_only >= 3 * per_page - 10
    )  # "Page n:" labels differ a token or two


def test_responses_take_video_and_files(omniray, model_name):
    clip = video_clip(seconds=2, fps=10, size=(96, 64))
    body = {
        "model": model_name,
        "max_output_tokens": 8,
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe both."},
                    {"type": "input_video", "video_url": _video_url(clip)},
                    {
                        "type": "input_file",
                        "filename": "a.pdf",
                        "file_data": _pdf_part(1)["file"]["file_data"],
                    },
                ],
            }
        ],
    }
    r = httpx.post(
        f"{omniray.http_url}/v1/responses",
        json=body,
        headers={"authorization": f"Bearer {LOCAL_API_KEY}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] > 4 * ROWS


def test_grpc_chat_takes_video_and_files(omniray, model_name):
    clip = video_clip(seconds=2, fps=10, size=(96, 64), audio_hz=300)
    channel = grpc_channel(omniray.grpc_target)
    try:
        stub = omni_pb2_grpc.OmniStub(channel)
        request = omni_pb2.ChatRequest(
            model=model_name,
            messages=[
                omni_pb2.Message(
                    role="user",
                    content=[
                        omni_pb2.ContentPart(text="Describe both."),
                        omni_pb2.ContentPart(video=omni_pb2.VideoPart(data=clip, use_audio_in_video=True)),
                        omni_pb2.ContentPart(file=omni_pb2.FilePart(data=pdf_document(1), filename="a.pdf")),
                    ],
                )
            ],
            sampling=common_pb2.SamplingParams(max_tokens=8, temperature=0),
        )
        chunks = list(stub.Chat(request, timeout=120))
    finally:
        channel.close()
    assert chunks[-1].finish_reason in ("length", "stop")
    assert chunks[-1].usage.prompt_tokens > 4 * ROWS
