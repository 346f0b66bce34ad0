"""OpenAI Chat Completions wire format: request parsing into the pipeline's typed Turn, and response /
SSE chunk rendering. The pipeline behind it is the same one gRPC and realtime use."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, TypeVar

from omni.v1 import common_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.datastructures import FormData, Headers
from starlette.formparsers import MultiPartException, MultiPartParser

from services.common import untrusted_json
from services.common.errors import OmniError, bad_request, too_large
from services.gateway.audio_files import SpeechFile
from services.models.profile import LimitsSpec
from services.pipeline import media
from services.pipeline.checks import MAX_STOP, MAX_STOP_CHARS
from services.pipeline.tools import MAX_TOOLS, CallDelta, ToolCall, Tools
from services.pipeline.tools import asked as tools_asked
from services.pipeline.turn import SEED_BOUND, Message, Part, Sampling, Turn, speech_out

INT32_MAX = 2**31 - 1
MAX_NAME_CHARS = 256  # model, voice, service tier: names, never free text
MAX_DESCRIPTION_CHARS = 4096
MAX_ARGUMENTS_CHARS = 65_536
MAX_FORM_FIELDS = 16
IMAGE_DETAILS = ("auto", "low", "high")
M = TypeVar("M", bound=BaseModel)


class _Loose(BaseModel):
    # Unknown OpenAI parameters are accepted and ignored, as vLLM does.
    model_config = ConfigDict(extra="allow")


Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
StopSequence = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class FunctionCall(_Loose):
    name: Name
    arguments: str = Field(default="", max_length=MAX_ARGUMENTS_CHARS)


class ToolCallParam(_Loose):
    id: Name
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallParam] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_call_id: Name | None = None

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self


FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class FunctionDef(_Loose):
    name: FunctionName
    description: str = Field(default="", max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(_Loose):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Loose):
    name: FunctionName


class NamedToolChoice(_Loose):
    type: Literal["function"]
    function: NamedFunction


class AudioParam(_Loose):
    voice: Name = "default"
    format: Literal["pcm16", "wav", "mp3", "opus", "flac", "aac"] = "pcm16"


class StreamOptions(_Loose):
    include_usage: bool = False


class JsonSchemaFormat(_Loose):
    name: Name = "response"
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Loose):
    """Structured output through vLLM's backend (xgrammar): a JSON schema or any JSON object."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(_Loose):
    """OpenAI's parameters with OpenAI's bounds; integers within the protobuf field they go to."""

    model: Name
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Name] | None = Field(default=None, max_length=2)  # which: checked by the pipeline
    audio: AudioParam | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    seed: int | None = Field(default=None, ge=-SEED_BOUND, lt=SEED_BOUND)
    stop: StopSequence | list[StopSequence] | None = Field(default=None)
    n: int = Field(default=1, ge=1, le=1)
    # Log probabilities are not returned; bounds as OpenAI's so a valid request is not refused.
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    # "flex" -> batch SLO class, "priority" -> the tenant's highest (services/router/plan.py).
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None = None
    response_format: ResponseFormat | None = None
    tools: list[ToolParam] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # OpenAI's deprecated function calling: refused (use tools), never ignored.
    functions: list[Any] | None = None
    function_call: Any = None

    @field_validator("functions", "function_call")
    @classmethod
    def _no_functions(cls, value):
        if value:
            raise ValueError("functions / function_call are deprecated; use tools and tool_choice")
        return value

    @model_validator(mode="after")
    def _schema_given(self) -> ChatCompletionRequest:
        f = self.response_format
        if f is not None and f.type == "json_schema" and (f.json_schema is None or not f.json_schema.schema_):
            raise ValueError("response_format json_schema needs json_schema.schema")
        return self

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return stop


def parse_body(raw: bytes) -> Any:
    """The request body as JSON, within untrusted_json's limits."""
    try:
        return untrusted_json.loads(raw)
    except untrusted_json.JsonLimitError as e:
        raise bad_request(f"request body: {e.message}", code=e.code) from None


async def parse_form(body: bytes, headers: Headers, *, max_files: int, max_part_size: int) -> FormData:
    """A multipart form (Starlette's parser over the body already read within its limit); the
    caller closes it."""

    async def stream() -> AsyncIterator[bytes]:
        yield body

    try:
        return await MultiPartParser(
            headers, stream(), max_files=max_files, max_fields=MAX_FORM_FIELDS, max_part_size=max_part_size
        ).parse()
    except MultiPartException as e:
        raise bad_request(f"multipart form: {str(e)[:200]}", code="invalid_form") from None


def validated(model: type[M], body: Any) -> M:
    """`body` as `model`, or a 422 naming the first field that is wrong."""
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"])
        raise OmniError(422, f"{param}: {first['msg']}", code="invalid_value", param=param) from None


def parse_request(
    body: Any, limits: LimitsSpec, *, session: str = "", slo_class: str = ""
) -> tuple[ChatCompletionRequest, Turn]:
    req = validated(ChatCompletionRequest, body)
    turn = Turn(
        model=req.model,
        messages=tuple(
            Message(
                role="system" if m.role == "developer" else m.role,
                parts=tuple(
                    content_part(part, f"messages.{i}.content.{j}", limits)
                    for j, part in enumerate(
                        [{"type": "text", "text": m.content}]
                        if isinstance(m.content, str)
                        else (m.content or [])
                    )
                ),
                tool_calls=tuple(
                    ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ()
                ),
                tool_call_id=m.tool_call_id or "",
            )
            for i, m in enumerate(req.messages)
        ),
        sampling=Sampling(
            max_tokens=req.max_completion_tokens or req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop=(req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ()),
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            **_structured(req.response_format),
        ),
        speech=speech_out(
            req.modalities or [], req.audio and req.audio.voice, req.audio and req.audio.format
        ),
        session=session,
        slo_class=slo_class,
        service_tier=req.service_tier or "",
        tools=_tools(req),
    )
    return req, turn


def _tools(req: ChatCompletionRequest) -> Tools | None:
    named = isinstance(req.tool_choice, NamedToolChoice)
    return tools_asked(
        [(t.function.name, t.function.description, t.function.parameters) for t in req.tools or ()],
        None if named else req.tool_choice,
        req.tool_choice.function.name if named else "",
        req.parallel_tool_calls,
    )


def _structured(f: ResponseFormat | None) -> dict:
    if f is None or f.type == "text":
        return {}
    if f.type == "json_object":
        return {"json_object": True}
    return {"json_schema": json.dumps(f.json_schema.schema_)}


def content_part(part: dict, param: str, limits: LimitsSpec) -> Part:
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise bad_request("text part needs a string 'text'", param=param)
        return part["text"]
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise bad_request("image_url part needs image_url.url", param=param)
        detail = image.get("detail", "auto") if isinstance(image, dict) else "auto"
        if detail not in IMAGE_DETAILS:
            raise bad_request(
                f"image_url.detail must be one of {IMAGE_DETAILS}", param=f"{param}.image_url.detail"
            )
        data = media.data_url_bytes(url, param=param, limit=limits.max_image_bytes)
        return media.image_input(data, detail, limits, param=param)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
            raise bad_request("input_audio part needs input_audio.data (base64)", param=param)
        fmt = audio.get("format", "wav")
        if fmt not in media.AUDIO_FORMATS:
            raise bad_request(
                f"input_audio.format must be one of {media.AUDIO_FORMATS}",
                code="invalid_audio_format",
                param=f"{param}.input_audio.format",
            )
        if len(audio["data"]) * 3 // 4 > limits.max_audio_bytes:
            raise too_large(
                f"audio is larger than {limits.max_audio_bytes} bytes", code="audio_too_large", param=param
            )
        return media.audio_clip(media.b64decode(audio["data"], param=param), fmt, limits, param=param)
    raise bad_request(
        "unsupported content part type; supported: text, image_url, input_audio",
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
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_prompt_tokens,
            "audio_tokens": usage.audio_prompt_tokens,
        },
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def completion(
    rid: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str,
    usage: common_pb2.Usage,
    audio: dict | None,
    calls: list[ToolCall] | None = None,
) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if audio is not None:
        # As OpenAI: with audio out, the words are the audio's transcript.
        message = {"role": "assistant", "content": None, "audio": audio}
    if calls is not None:
        message["tool_calls"] = [tool_call(c) for c in calls]
        message["content"] = message["content"] or None
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage_dict(usage),
    }


def tool_call(c: ToolCall, index: int | None = None) -> dict:
    out = {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
    return out if index is None else {"index": index, **out}


def tool_call_delta(d: CallDelta) -> dict:
    """A streamed call piece: the first names the call."""
    if d.id:
        return tool_call(ToolCall(d.id, d.name, d.arguments), d.index)
    return {"index": d.index, "function": {"arguments": d.arguments}}


def audio_message(audio_id: str, pcm16: bytes, sample_rate: int, fmt: str, transcript: str) -> dict:
    """A whole answer's audio message: pcm16 as it is, other formats as one file of that format
    (a WAV with its sizes written, not a stream's placeholder)."""
    if fmt == "pcm16":
        data = pcm16
    elif fmt == "wav":
        data = media.wav_bytes(pcm16, sample_rate)
    else:
        file = SpeechFile(fmt, rate=sample_rate)
        data = file.push(pcm16) + file.close()
    return {
        "id": audio_id,
        "data": base64.b64encode(data).decode(),
        "expires_at": int(time.time()) + 3600,
        "transcript": transcript,
        "format": fmt,
        "sample_rate": sample_rate,
    }
