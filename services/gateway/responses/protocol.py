"""OpenAI's Responses API (POST /v1/responses) on the wire: the request into the pipeline's typed
Turn (input items as messages, function calls and their outputs, `text.format` as structured
output, function tools as chat's), and the pipeline's events out as a Response object or its stream
of typed events (render.py).

Nothing is stored: `store` is taken and treated as false, so `previous_response_id`, `conversation`
and `background` (which need stored responses) are refused with a 400 that says so. Audio output is
omniray's extension (chat's `modalities` and `audio`): the message's content is an `output_audio`
part, streamed as `response.audio.delta` / `response.audio.transcript.delta`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, model_validator

from services.common.errors import bad_request
from services.gateway import protocol
from services.gateway.protocol import (
    INT32_MAX,
    MAX_DESCRIPTION_CHARS,
    AudioParam,
    FunctionName,
    Loose,
    MmProcessorKwargs,
    Name,
    validated,
)
from services.models.profile import LimitsSpec
from services.pipeline.tools import MAX_TOOLS, ToolCall, Tools
from services.pipeline.tools import asked as tools_asked
from services.pipeline.turn import SEED_BOUND, Message, Sampling, Turn, speech_out

MAX_INPUT_ITEMS = 1024
MAX_INSTRUCTIONS_CHARS = 256 * 1024


class FunctionToolParam(Loose):
    type: Literal["function"]
    name: FunctionName
    description: str = Field(default="", max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(Loose):
    type: Literal["function"]
    name: FunctionName


class TextFormat(Loose):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Name = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    strict: bool | None = None


class TextParam(Loose):
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(Loose):
    model: Name
    input: str | list[dict[str, Any]] = Field(max_length=MAX_INPUT_ITEMS)
    instructions: str | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=-SEED_BOUND, lt=SEED_BOUND)  # omniray's, as chat's
    stream: bool = False
    store: bool = True  # taken; nothing is stored
    metadata: dict[str, Any] | None = Field(default=None, max_length=16)
    tools: list[FunctionToolParam] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextParam | None = None
    modalities: list[Name] | None = Field(default=None, max_length=2)
    audio: AudioParam | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    # vLLM's, as chat's: {"use_audio_in_video": true}
    mm_processor_kwargs: MmProcessorKwargs | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponsesRequest:
        f = self.text.format if self.text else None
        if f is not None and f.type == "json_schema" and not f.schema_:
            raise ValueError("text.format json_schema needs a schema")
        return self


def parse(
    body: Any, limits: LimitsSpec, *, session: str = "", slo_class: str = ""
) -> tuple[ResponsesRequest, Turn]:
    req = validated(ResponsesRequest, body)
    for field in ("previous_response_id", "conversation", "background"):
        if getattr(req, field):
            raise bad_request(
                f"{field} needs stored responses; this server stores none (send the whole input each time)",
                code="unsupported_parameter",
                param=field,
            )
    messages = [Message("system", (req.instructions,))] if req.instructions else []
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    with_track = bool(req.mm_processor_kwargs and req.mm_processor_kwargs.use_audio_in_video)
    messages += [_message(item, f"input.{i}", limits, with_track) for i, item in enumerate(items)]
    f = req.text.format if req.text else None
    structured = {}
    if f is not None and f.type == "json_object":
        structured = {"json_object": True}
    elif f is not None and f.type == "json_schema":
        structured = {"json_schema": json.dumps(f.schema_)}
    turn = Turn(
        model=req.model,
        messages=tuple(messages),
        sampling=Sampling(
            max_tokens=req.max_output_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            **structured,
        ),
        speech=speech_out(
            req.modalities or [], req.audio and req.audio.voice, req.audio and req.audio.format
        ),
        session=session,
        slo_class=slo_class,
        tools=_tools(req),
    )
    return req, turn


_PARTS = {
    "input_text": "text",
    "output_text": "text",
    "input_image": "image_url",
    "input_audio": "input_audio",
    # omniray's (the Responses API has no video part): {"type": "input_video", "video_url": "data:..."}
    "input_video": "video_url",
    "input_file": "file",
}


def _message(item: dict, param: str, limits: LimitsSpec, use_audio_in_video: bool = False) -> Message:
    kind = item.get("type", "message")
    if kind == "function_call":
        call = validated(_FunctionCallItem, item)
        return Message("assistant", (), tool_calls=(ToolCall(call.call_id, call.name, call.arguments),))
    if kind == "function_call_output":
        out = validated(_FunctionOutputItem, item)
        return Message("tool", (out.output,), tool_call_id=out.call_id)
    if kind != "message":
        raise bad_request(f"input items of type {str(kind)[:32]!r} are not supported", param=f"{param}.type")
    m = validated(_MessageItem, item)
    content = [{"type": "input_text", "text": m.content}] if isinstance(m.content, str) else m.content
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _PARTS:
            raise bad_request(f"content parts are one of {sorted(_PARTS)}", param=f"{param}.content.{j}")
        if kind == "input_image":  # the Responses API puts the URL (or file id) beside `detail`
            part = {
                "type": "image_url",
                "image_url": {"url": part.get("image_url"), "detail": part.get("detail", "auto")},
            }
        elif kind == "input_video":
            part = {"type": "video_url", "video_url": {"url": part.get("video_url")}}
        elif kind == "input_file":  # the Responses API puts file_data beside the type
            part = {"type": "file", "file": {k: part.get(k) for k in ("file_data", "file_id") if k in part}}
        else:
            part = {**part, "type": _PARTS[kind]}
        parts.append(
            protocol.content_part(part, f"{param}.content.{j}", limits, use_audio_in_video=use_audio_in_video)
        )
    role = "system" if m.role == "developer" else m.role
    return Message(role, tuple(parts))


class _MessageItem(Loose):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[dict[str, Any]]


class _FunctionCallItem(Loose):
    call_id: Name
    name: FunctionName
    arguments: str = Field(default="", max_length=protocol.MAX_ARGUMENTS_CHARS)


class _FunctionOutputItem(Loose):
    call_id: Name
    output: str = Field(max_length=protocol.MAX_ARGUMENTS_CHARS)


def _tools(req: ResponsesRequest) -> Tools | None:
    named = isinstance(req.tool_choice, NamedFunctionChoice)
    return tools_asked(
        [(t.name, t.description, t.parameters) for t in req.tools or ()],
        None if named else req.tool_choice,
        req.tool_choice.name if named else "",
        req.parallel_tool_calls,
    )
