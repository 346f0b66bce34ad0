"""OpenAI Chat Completions wire format: request parsing into the shared ChatRequest proto, and
response / SSE chunk rendering. The pipeline behind it is the same one gRPC uses."""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

from omni.v1 import common_pb2, omni_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.common.errors import OmniError, bad_request
from services.gateway import media
from services.models.profile import LimitsSpec


class _Loose(BaseModel):
    # Unknown OpenAI parameters are accepted and ignored, as vLLM does.
    model_config = ConfigDict(extra="allow")


class ChatMessage(_Loose):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None


class AudioParam(_Loose):
    voice: str = "default"
    format: Literal["wav", "pcm16"] = "pcm16"


class StreamOptions(_Loose):
    include_usage: bool = False


class ChatCompletionRequest(_Loose):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[str] | None = None
    audio: AudioParam | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    # "flex" -> batch SLO class, "priority" -> the tenant's highest (services/router/plan.py).
    service_tier: str | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n


def parse_request(body: Any, limits: LimitsSpec) -> tuple[ChatCompletionRequest, omni_pb2.ChatRequest]:
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"])
        raise OmniError(422, f"{param}: {first['msg']}", code="invalid_value", param=param) from None
    proto = omni_pb2.ChatRequest(
        model=req.model,
        modalities=req.modalities or ["text"],
        service_tier=req.service_tier or "",
        sampling=common_pb2.SamplingParams(
            max_tokens=req.max_completion_tokens or req.max_tokens or 0,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed or 0,
            stop=[req.stop] if isinstance(req.stop, str) else (req.stop or []),
        ),
    )
    if req.audio is not None:
        proto.audio.voice, proto.audio.format = req.audio.voice, req.audio.format
    for i, m in enumerate(req.messages):
        msg = proto.messages.add(role=m.role)
        parts = [{"type": "text", "text": m.content}] if isinstance(m.content, str) else (m.content or [])
        for j, part in enumerate(parts):
            _add_part(msg, part, f"messages.{i}.content.{j}", limits)
    return req, proto


def _add_part(msg: omni_pb2.Message, part: dict, param: str, limits: LimitsSpec) -> None:
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise bad_request("text part needs a string 'text'", param=param)
        msg.content.add(text=part["text"])
    elif kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise bad_request("image_url part needs image_url.url", param=param)
        data = media.data_url_bytes(url, param=param, limit=limits.max_image_bytes)
        detail = image.get("detail", "auto") if isinstance(image, dict) else "auto"
        msg.content.add(image=omni_pb2.ImagePart(data=data, detail=detail))
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
            raise bad_request("input_audio part needs input_audio.data (base64)", param=param)
        data = media.b64decode(audio["data"], param=param)
        msg.content.add(audio=omni_pb2.AudioPart(data=data, format=audio.get("format", "wav")))
    else:
        raise bad_request(
            f"unsupported content part type {kind!r}; supported: text, image_url, input_audio",
            code="unsupported_content_type",
            param=param,
        )


# ---- responses ----


def chunk(rid: str, model: str, created: int, delta: dict, finish_reason: str | None = None) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(rid: str, model: str, created: int, usage: common_pb2.Usage) -> dict:
    """The last chunk with `stream_options.include_usage`: no choices, just usage."""
    return {**chunk(rid, model, created, {}), "choices": [], "usage": usage_dict(usage)}


def progress_chunk(rid: str, model: str, created: int, progress: common_pb2.Progress) -> dict:
    """omniray's progress event (documents): no choices, so OpenAI clients skip it."""
    fields = ("stage", "tiles_done", "tiles_total", "images_done", "images_total")
    return {
        **chunk(rid, model, created, {}),
        "choices": [],
        "omniray_progress": {f: getattr(progress, f) for f in fields},
    }


def usage_dict(usage: common_pb2.Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


def completion(
    rid: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str,
    usage: common_pb2.Usage,
    audio: dict | None,
) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if audio is not None:
        # As OpenAI: with audio out, the words are the audio's transcript.
        message = {"role": "assistant", "content": None, "audio": audio}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage_dict(usage),
    }


def audio_message(audio_id: str, pcm16: bytes, sample_rate: int, fmt: str, transcript: str) -> dict:
    data = media.wav_bytes(pcm16, sample_rate) if fmt == "wav" else pcm16
    return {
        "id": audio_id,
        "data": base64.b64encode(data).decode(),
        "expires_at": int(time.time()) + 3600,
        "transcript": transcript,
        "format": fmt,
        "sample_rate": sample_rate,
    }
