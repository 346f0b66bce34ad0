"""The gRPC wire: omni.v1.ChatRequest into the pipeline's typed Turn (`chat_turn`), and omni.v1.Omni
registered with Serve's gRPC server, with request bytes that fail to decode kept as a value instead
of an exception.

grpcio answers a request its deserializer cannot parse (invalid UTF-8 in a string field, a length
past the end) with UNKNOWN and the parser's exception text. Here the generated handlers are
registered with a deserializer that returns `Undecodable` instead; the gateway answers that with
INVALID_ARGUMENT (Chat) or an `error` event with the session going on (Realtime). Serve's proxy
keeps each handler's request deserializer, so this runs in the proxy process."""

from __future__ import annotations

import re
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from omni.v1 import omni_pb2, omni_pb2_grpc

from services.common import untrusted_json
from services.common.errors import OmniError, bad_request
from services.models.profile import LimitsSpec
from services.pipeline import media
from services.pipeline.documents import file_data, pdf_document
from services.pipeline.tools import Tool, ToolCall, Tools
from services.pipeline.turn import Message, Part, Sampling, Turn, speech_out
from services.pipeline.video_input import video_input

ROLES = ("system", "developer", "user", "assistant", "tool")
IMAGE_DETAILS = ("auto", "low", "high")
SLO_HEADER = "x-omniray-slo-class"
SESSION_HEADER = "x-omniray-session-id"


@dataclass(frozen=True)
class Undecodable:
    """Bytes that are not the method's request message; `reason` says why, in our words."""

    reason: str
    message: str = ""  # the request message's full name

    def error(self) -> OmniError:
        return bad_request(f"request is not an {self.message}: {self.reason}", code="invalid_protobuf")


def _lenient(parse):
    message = getattr(getattr(parse, "__self__", None), "DESCRIPTOR", None)
    name = message.full_name if message is not None else "omni.v1 message"

    def deserialize(raw: bytes):
        try:
            return parse(raw)
        except DecodeError as e:
            utf8 = "UTF-8" in str(e)
            return Undecodable(
                "a string field is not valid UTF-8" if utf8 else "the protobuf wire format is corrupt", name
            )

    return deserialize


# What makes a method handler of each kind (request streaming, response streaming), and its behavior's
# attribute: a handler is rebuilt through grpcio's public factories, its deserializer swapped.
_HANDLER_KINDS = {
    (False, False): (grpc.unary_unary_rpc_method_handler, "unary_unary"),
    (False, True): (grpc.unary_stream_rpc_method_handler, "unary_stream"),
    (True, False): (grpc.stream_unary_rpc_method_handler, "stream_unary"),
    (True, True): (grpc.stream_stream_rpc_method_handler, "stream_stream"),
}


def _lenient_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    make, behavior = _HANDLER_KINDS[(handler.request_streaming, handler.response_streaming)]
    return make(
        getattr(handler, behavior),
        request_deserializer=_lenient(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


class _Registration:
    """Stands in for the server while the generated code registers: it keeps the method handler
    table, which the generated code passes by name to `add_registered_method_handlers` (its generic
    handler holds the same table, readable only through grpcio's internals)."""

    def __init__(self):
        self.service, self.handlers = "", {}

    def add_generic_rpc_handlers(self, generic_handlers) -> None:
        pass

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        self.service, self.handlers = service_name, method_handlers


def add_omni_servicer_to_server(servicer, server) -> None:
    """omni.v1.Omni on `server` (Serve's), as the generated code registers it, deserializers swapped."""
    generated = _Registration()
    omni_pb2_grpc.add_OmniServicer_to_server(servicer, generated)
    handlers = {name: _lenient_handler(h) for name, h in generated.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(generated.service, handlers),))
    server.add_registered_method_handlers(generated.service, handlers)


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CHOICES = ("none", "auto", "required")
# ChatChunk audio is pcm16 deltas; "wav" is taken as the same (what the REST stream does).
GRPC_AUDIO_FORMATS = ("", "pcm16", "wav")


def chat_turn(request: omni_pb2.ChatRequest, limits: LimitsSpec, metadata: dict[str, str]) -> Turn:
    """omni.v1.ChatRequest as the pipeline's Turn (its SLO class and session from the message, else
    the x-omniray-* metadata)."""
    messages = []
    for i, m in enumerate(request.messages):
        if m.role not in ROLES:
            raise bad_request(f"unknown role {m.role[:32]!r}", param=f"messages.{i}.role")
        messages.append(
            Message(
                role="system" if m.role == "developer" else m.role,
                parts=tuple(
                    _part(part, f"messages.{i}.content.{j}", limits) for j, part in enumerate(m.content)
                ),
                tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
                tool_call_id=m.tool_call_id,
            )
        )
    s = request.sampling
    sampling = (
        Sampling(
            max_tokens=s.max_tokens or None,
            temperature=s.temperature,
            top_p=s.top_p if s.top_p != 0 else 1.0,  # 0: not set in proto3 (the rest is range-checked)
            seed=s.seed or None,
            stop=tuple(s.stop),
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            json_schema=s.json_schema or None,
            json_object=s.json_object,
        )
        if request.HasField("sampling")
        else Sampling()
    )
    if request.HasField("sampling") and s.max_tokens < 0:
        raise bad_request("max_tokens must be positive", param="max_tokens")
    if request.audio.format not in GRPC_AUDIO_FORMATS:
        raise bad_request(f"audio.format must be one of {GRPC_AUDIO_FORMATS[1:]}", param="audio.format")
    return Turn(
        model=request.model,
        messages=tuple(messages),
        sampling=sampling,
        speech=speech_out(list(request.modalities), request.audio.voice, request.audio.format),
        session=request.session_id or metadata.get(SESSION_HEADER, ""),
        slo_class=request.slo_class or metadata.get(SLO_HEADER, ""),
        service_tier=request.service_tier,
        tools=_tools(request),
    )


def _tools(request: omni_pb2.ChatRequest) -> Tools | None:
    if not request.tools and not request.tool_choice and not request.tool_choice_function:
        return None
    for i, t in enumerate(request.tools):
        if not TOOL_NAME.fullmatch(t.name):
            raise bad_request("a tool's name is 1-64 letters, digits, _ or -", param=f"tools.{i}.name")
        if t.parameters_json:  # a JSON Schema object, parsed with REST's limits
            try:
                parameters = untrusted_json.loads(t.parameters_json)
            except untrusted_json.JsonLimitError as e:
                raise bad_request(
                    f"parameters_json: {e.message}", param=f"tools.{i}.parameters_json"
                ) from None
            if not isinstance(parameters, dict):
                raise bad_request("parameters_json is not a JSON object", param=f"tools.{i}.parameters_json")
    specs = tuple(Tool(t.name, t.description, t.parameters_json) for t in request.tools)
    parallel = not request.sequential_tool_calls
    if request.tool_choice_function:
        return Tools(specs, "function", request.tool_choice_function, parallel)
    choice = request.tool_choice or ("auto" if specs else "none")
    if choice not in TOOL_CHOICES:
        raise bad_request(f"tool_choice is one of {TOOL_CHOICES}", param="tool_choice")
    return Tools(specs, choice, parallel=parallel)


def _part(part: omni_pb2.ContentPart, param: str, limits: LimitsSpec) -> Part:
    kind = part.WhichOneof("part")
    if kind == "text":
        return part.text
    if kind == "image":
        detail = part.image.detail or "auto"
        if detail not in IMAGE_DETAILS:
            raise bad_request(f"detail must be one of {IMAGE_DETAILS}", param=f"{param}.image_url.detail")
        data = part.image.data or media.data_url_bytes(
            part.image.url, param=param, limit=limits.max_image_bytes
        )
        return media.image_input(data, detail, limits, param=param)
    if kind == "audio":
        return media.audio_clip(part.audio.data, part.audio.format or "wav", limits, param=param)
    if kind == "video":
        data = part.video.data or media.data_url_bytes(
            part.video.url, param=param, limit=limits.max_video_bytes, what="video"
        )
        return video_input(data, limits, with_audio=part.video.use_audio_in_video, param=param)
    if kind == "file":
        data = part.file.data or file_data(part.file.file_data, limits, param=param)
        return pdf_document(data, limits, param=param)
    raise bad_request("empty content part", param=param)
