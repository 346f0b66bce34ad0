"""OpenAI's Responses API (POST /v1/responses) on the wire: the request into the pipeline's typed
Turn (input items as messages, function calls and their outputs, `text.format` as structured
output, function tools as chat's), and the pipeline's events out as a Response object or its stream
of typed events (`sequence_number`ed, in OpenAI's order).

Nothing is stored: `store` is taken and treated as false, so `previous_response_id`, `conversation`
and `background` (which need stored responses) are refused with a 400 that says so. Audio output is
omniray's extension (chat's `modalities` and `audio`): the message's content is an `output_audio`
part, streamed as `response.audio.delta` / `response.audio.transcript.delta`.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from omni.v1 import common_pb2
from pydantic import Field, model_validator

from services.common.errors import bad_request
from services.gateway import openai_api
from services.gateway.audio_files import SpeechFile
from services.gateway.openai_api import (
    INT32_MAX,
    MAX_DESCRIPTION_CHARS,
    AudioParam,
    FunctionName,
    Name,
    _Loose,
    validated,
)
from services.models.profile import LimitsSpec
from services.pipeline.pipeline import Event
from services.pipeline.tools import MAX_TOOLS, ToolCall, Tools, new_call_id
from services.pipeline.tools import asked as tools_asked
from services.pipeline.turn import SEED_BOUND, Message, Sampling, Turn, speech_out

MAX_INPUT_ITEMS = 1024
MAX_INSTRUCTIONS_CHARS = 256 * 1024


class FunctionToolParam(_Loose):
    type: Literal["function"]
    name: FunctionName
    description: str = Field(default="", max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(_Loose):
    type: Literal["function"]
    name: FunctionName


class TextFormat(_Loose):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Name = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    strict: bool | None = None


class TextParam(_Loose):
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(_Loose):
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
    messages += [_message(item, f"input.{i}", limits) for i, item in enumerate(items)]
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
}


def _message(item: dict, param: str, limits: LimitsSpec) -> Message:
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
        else:
            part = {**part, "type": _PARTS[kind]}
        parts.append(openai_api.content_part(part, f"{param}.content.{j}", limits))
    role = "system" if m.role == "developer" else m.role
    return Message(role, tuple(parts))


class _MessageItem(_Loose):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[dict[str, Any]]


class _FunctionCallItem(_Loose):
    call_id: Name
    name: FunctionName
    arguments: str = Field(default="", max_length=openai_api.MAX_ARGUMENTS_CHARS)


class _FunctionOutputItem(_Loose):
    call_id: Name
    output: str = Field(max_length=openai_api.MAX_ARGUMENTS_CHARS)


def _tools(req: ResponsesRequest) -> Tools | None:
    named = isinstance(req.tool_choice, NamedFunctionChoice)
    return tools_asked(
        [(t.name, t.description, t.parameters) for t in req.tools or ()],
        None if named else req.tool_choice,
        req.tool_choice.name if named else "",
        req.parallel_tool_calls,
    )


# ---- output ------------------------------------------------------------------------------------


class Rendered:
    """One response's output as the Responses API shows it, built from the pipeline's events: a
    message (text, or audio with its transcript), or function calls when the request required one."""

    def __init__(self, req: ResponsesRequest, turn: Turn, model: str, speak: bool, audio_format: str):
        self.req, self.model = req, model
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.tools = turn.tools if turn.tools is not None and turn.tools.forced else None
        self.speak, self.audio_format = speak, audio_format
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.text: list[str] = []
        self.pcm = bytearray()
        self.calls: list[ToolCall] = []
        self.status = "in_progress"
        self.usage = common_pb2.Usage()
        self.seq = 0

    # -- the Response object

    def response(self) -> dict:
        done = self.status != "in_progress"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": self.req.instructions,
            "max_output_tokens": self.req.max_output_tokens,
            "model": self.model,
            "output": self.output() if done else [],
            "parallel_tool_calls": self.req.parallel_tool_calls,
            "previous_response_id": None,
            "store": False,
            "temperature": self.req.temperature,
            "text": {
                "format": (
                    self.req.text.format.model_dump(by_alias=True, exclude_none=True)
                    if self.req.text
                    else {"type": "text"}
                )
            },  # fmt: skip
            "tool_choice": _choice(self.req.tool_choice),
            "tools": [t.model_dump(exclude_none=True) for t in self.req.tools or ()],
            "top_p": self.req.top_p,
            "truncation": "disabled",
            "metadata": self.req.metadata or {},
            "usage": self._usage() if done else None,
        }

    def output(self) -> list[dict]:
        if self.tools is not None:
            return [self._call_item(c, self.item_status) for c in self.calls]
        return [self._message(self.item_status)]

    @property
    def item_status(self) -> str:
        return "completed" if self.status == "completed" else "incomplete"

    def _message(self, status: str) -> dict:
        content = [self._part()] if status != "in_progress" else []
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def _part(self, whole: bool = True) -> dict:
        text = "".join(self.text) if whole else ""
        if not self.speak:
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        part: dict = {"type": "output_audio", "transcript": text, "format": self.audio_format}
        if whole:
            part["data"] = base64.b64encode(self._audio_file()).decode()
        return part

    def _audio_file(self) -> bytes:
        fmt = "pcm" if self.audio_format == "pcm16" else self.audio_format
        file = SpeechFile(fmt)
        return file.push(bytes(self.pcm)) + file.close()

    @staticmethod
    def _call_item(c: ToolCall, status: str) -> dict:
        return {"id": f"fc_{c.id[5:]}", "type": "function_call", "status": status, "call_id": c.id,
                "name": c.name, "arguments": c.arguments}  # fmt: skip

    def _usage(self) -> dict:
        u = self.usage
        return {
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": u.cached_prompt_tokens,
                "cache_write_tokens": 0,
                "audio_tokens": u.audio_prompt_tokens,
            },
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens,
        }

    def _finished(self, ev: Event) -> None:
        self.usage = ev.usage or self.usage
        self.status = "incomplete" if ev.finish_reason == "length" else "completed"
        if self.tools is not None:
            if self.tools.choice == "function":
                self.calls[0] = ToolCall(self.calls[0].id, self.calls[0].name, "".join(self.text))
            else:
                self.calls = self.tools.calls("".join(self.text))

    # -- whole

    async def whole(self, events: AsyncIterator[Event]) -> dict:
        if self.tools is not None and self.tools.choice == "function":
            self.calls = [ToolCall(new_call_id(), self.tools.name, "")]
        async for ev in events:
            self.text.append(ev.text)
            self.pcm += ev.pcm16
            if ev.finish_reason:
                self._finished(ev)
        return self.response()

    # -- stream

    def _event(self, kind: str, **fields) -> str:
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.seq, **fields})}\n\n"

    async def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        yield self._event("response.created", response=self.response())
        yield self._event("response.in_progress", response=self.response())
        named = self.tools is not None and self.tools.choice == "function"
        at = {"output_index": 0}
        if named:
            self.calls = [ToolCall(new_call_id(), self.tools.name, "")]
            item = self._call_item(self.calls[0], "in_progress")
            yield self._event("response.output_item.added", item=item, **at)
        elif self.tools is None:
            yield self._event("response.output_item.added", item=self._message("in_progress"), **at)
            at = {**at, "item_id": self.message_id, "content_index": 0}
            yield self._event("response.content_part.added", part=self._part(whole=False), **at)
        async for ev in events:
            if ev.is_text or ev.text:
                self.text.append(ev.text)
                if named:
                    yield self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=0, delta=ev.text)  # fmt: skip
                elif self.tools is None and self.speak:
                    yield self._event("response.audio.transcript.delta", delta=ev.text, **at)
                elif self.tools is None:
                    yield self._event("response.output_text.delta", delta=ev.text, logprobs=[], **at)
            if ev.pcm16:
                self.pcm += ev.pcm16
                yield self._event("response.audio.delta", delta=base64.b64encode(ev.pcm16).decode(), **at)
            if ev.finish_reason:
                self._finished(ev)
        if self.tools is not None:
            for i, call in enumerate(self.calls):
                item = self._call_item(call, self.item_status)
                if not named:
                    yield self._event(
                        "response.output_item.added", item={**item, "status": "in_progress"}, output_index=i
                    )
                    yield self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=i, delta=call.arguments)  # fmt: skip
                yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                  name=call.name, arguments=call.arguments)  # fmt: skip
                yield self._event("response.output_item.done", item=item, output_index=i)
        else:
            text = "".join(self.text)
            if self.speak:
                yield self._event("response.audio.done", **at)
                yield self._event("response.audio.transcript.done", transcript=text, **at)
            else:
                yield self._event("response.output_text.done", text=text, logprobs=[], **at)
            yield self._event("response.content_part.done", part=self._part(), **at)
            yield self._event(
                "response.output_item.done", item=self._message(self.item_status), output_index=0
            )
        done = "response.incomplete" if self.status == "incomplete" else "response.completed"
        yield self._event(done, response=self.response())

    def failed(self, error: dict) -> str:
        self.status = "failed"
        response = {**self.response(), "error": {"code": error.get("code") or "server_error",
                                                  "message": error["message"]}}  # fmt: skip
        return self._event("response.failed", response=response)


def _choice(choice) -> str | dict:
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else {"type": "function", "name": choice.name}
