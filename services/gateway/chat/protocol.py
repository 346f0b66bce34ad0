"""Chat Completions' request: OpenAI's parameters with OpenAI's bounds, as the pipeline's typed Turn."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.gateway.protocol import (
    INT32_MAX,
    MAX_ARGUMENTS_CHARS,
    MAX_DESCRIPTION_CHARS,
    MAX_NAME_CHARS,
    AudioParam,
    FunctionName,
    Loose,
    MmProcessorKwargs,
    Name,
    Penalty,
    StopSequence,
    content_part,
    validated,
)
from services.models.profile import LimitsSpec
from services.pipeline.checks import MAX_STOP
from services.pipeline.tools import MAX_TOOLS, ToolCall, Tools
from services.pipeline.tools import asked as tools_asked
from services.pipeline.turn import SEED_BOUND, Message, Sampling, Turn, speech_out


class FunctionCall(Loose):
    name: Name
    arguments: str = Field(default="", max_length=MAX_ARGUMENTS_CHARS)


class ToolCallParam(Loose):
    id: Name
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Loose):
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


class FunctionDef(Loose):
    name: FunctionName
    description: str = Field(default="", max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(Loose):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Loose):
    name: FunctionName


class NamedToolChoice(Loose):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(Loose):
    include_usage: bool = False


class JsonSchemaFormat(Loose):
    name: Name = "response"
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Loose):
    """Structured output through vLLM's backend (xgrammar): a JSON schema or any JSON object."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(Loose):
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
    # vLLM's: {"use_audio_in_video": true} gives the model a video_url clip's audio track too
    mm_processor_kwargs: MmProcessorKwargs | None = None

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
                    content_part(
                        part,
                        f"messages.{i}.content.{j}",
                        limits,
                        use_audio_in_video=bool(
                            req.mm_processor_kwargs and req.mm_processor_kwargs.use_audio_in_video
                        ),
                    )
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
