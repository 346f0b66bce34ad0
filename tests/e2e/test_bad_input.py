"""Malformed and oversized REST input gets a 4xx with an OpenAI-style error body, never a 500 or
a hang, and the server keeps answering."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.conftest import AUTH, data_url, png_bytes, wav_bytes


@pytest.fixture(scope="module")
def http(omniray):
    with httpx.Client(base_url=omniray.http_url, timeout=120, headers=AUTH) as client:
        yield client


def _chat(model_name, content, **extra):
    return {"model": model_name, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def _audio_part(data: bytes, fmt="wav"):
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def _huge_png_header(side: int, height: int | None = None) -> bytes:
    """A valid PNG whose header declares side x height px (1-bit, compresses to almost nothing)."""
    buf = io.BytesIO()
    Image.new("1", (side, height or side)).save(buf, format="PNG")
    return buf.getvalue()


def _long_wav(seconds: int) -> bytes:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(8000 * seconds, dtype=np.int16), 8000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


CASES = {
    "invalid_json": (lambda m: b'{"model": ', 400, "invalid_json"),
    "not_an_object": (lambda m: b"[1, 2]", 400, "invalid_request"),
    "unknown_model": (lambda m: {**_chat(m, "hi"), "model": "gpt-17"}, 400, "model_not_found"),
    "empty_messages": (lambda m: {"model": m, "messages": []}, 422, "invalid_value"),
    "missing_messages": (lambda m: {"model": m}, 422, "invalid_value"),
    "bad_role": (
        lambda m: {"model": m, "messages": [{"role": "robot", "content": "x"}]},
        422,
        "invalid_value",
    ),
    "bad_temperature": (lambda m: _chat(m, "hi", temperature=9), 422, "invalid_value"),
    "n_not_1": (lambda m: _chat(m, "hi", n=3), 422, "invalid_value"),
    "max_tokens_over_cap": (lambda m: _chat(m, "hi", max_tokens=100000), 400, "invalid_request"),
    "undecodable_image": (
        lambda m: _chat(m, [_image_part("data:image/png;base64," + base64.b64encode(b"nope").decode())]),
        400,
        "invalid_image",
    ),
    "bad_base64_image": (
        lambda m: _chat(m, [_image_part("data:image/png;base64,@@@")]),
        400,
        "invalid_base64",
    ),
    "remote_image_url": (
        lambda m: _chat(m, [_image_part("http://example.com/cat.png")]),
        400,
        "invalid_image_url",
    ),
    "gif_image": (lambda m: _chat(m, [_image_part(data_url(_gif(), "image/gif"))]), 400, "invalid_image"),
    "image_over_20mb": (
        lambda m: _chat(m, [_image_part("data:image/png;base64," + "A" * (28 * 1024 * 1024))]),
        413,
        "image_too_large",
    ),
    "image_over_8000px": (
        lambda m: _chat(m, [_image_part(data_url(_huge_png_header(8001)))]),
        413,
        "image_too_large",
    ),
    "undecodable_audio": (lambda m: _chat(m, [_audio_part(b"RIFF....WAVEjunk")]), 400, "invalid_audio"),
    "audio_too_long": (lambda m: _chat(m, [_audio_part(_long_wav(121))]), 413, "audio_too_long"),
    "audio_bad_format": (
        lambda m: _chat(m, [_audio_part(wav_bytes(), fmt="flac")]),
        400,
        "invalid_audio_format",
    ),
    "unsupported_part": (
        lambda m: _chat(m, [{"type": "input_video", "input_video": {"url": "x"}}]),
        400,
        "unsupported_content_type",
    ),
    "unsupported_modality": (
        lambda m: _chat(m, "hi", modalities=["text", "video"]),
        400,
        "unsupported_modality",
    ),
    "audio_only_modality": (lambda m: _chat(m, "hi", modalities=["audio"]), 400, "unsupported_modality"),
    "unknown_voice": (
        lambda m: _chat(m, "hi", modalities=["text", "audio"], audio={"voice": "zz", "format": "wav"}),
        400,
        "invalid_request",
    ),
    "body_over_limit": (lambda m: b"x" * (49 * 1024 * 1024), 413, "request_too_large"),
    "bad_image_detail": (
        lambda m: _chat(
            m, [{"type": "image_url", "image_url": {"url": data_url(png_bytes()), "detail": "ultra"}}]
        ),
        400,
        "invalid_request",
    ),
}


@pytest.mark.parametrize(
    "headers",
    [{"x-omniray-slo-class": "urgent"}, {"x-omniray-session-id": "s" * 129}],
    ids=["unknown_slo_class", "session_id_too_long"],
)
def test_bad_routing_headers_are_400(http, model_name, headers):
    r = http.post("/v1/chat/completions", json=_chat(model_name, "hi"), headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/chat/completions", json=_chat(model_name, "hi")).status_code == 200


def _gif() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="GIF")
    return buf.getvalue()


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejected_with_openai_error(http, model_name, case):
    make, status, code = CASES[case]
    payload = make(model_name)
    if isinstance(payload, bytes):
        r = http.post("/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
    else:
        r = http.post("/v1/chat/completions", json=payload)
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert err["code"] == code
    assert err["message"] and err["type"]
    # The server keeps serving.
    ok = http.post("/v1/chat/completions", json=_chat(model_name, "still there?"))
    assert ok.status_code == 200


def test_image_at_the_side_limit_is_accepted(http, model_name):
    """8000 px per side and 40 M pixels are allowed (8001 px and more pixels are rejected): the
    limits are inclusive."""
    url = data_url(_huge_png_header(8000, 5000))
    r = http.post("/v1/chat/completions", json=_chat(model_name, [_image_part(url)]))
    assert r.status_code == 200, r.text[:300]
