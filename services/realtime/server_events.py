"""Server events of the Realtime API: one pydantic class per event this server sends (OpenAI
Realtime's names and shapes, and omniray's extensions), the single definition both transports
encode from and clients decode with:

- JSON (the WebSocket): `to_json` / `parse`; audio deltas as base64, as OpenAI's;
- protobuf (gRPC, `omni.v1.RealtimeServerEvent`): services/realtime/grpc_events.py `to_proto` /
  `from_proto`.

The session builds these; nothing else writes a server event by hand.
"""

from __future__ import annotations

import base64
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, TypeAdapter

from services.realtime.events import SessionConfig


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def _b64decode(value: Any) -> Any:
    return base64.b64decode(value, validate=True) if isinstance(value, str) else value


# pcm16 audio: bytes in memory and protobuf, base64 text in JSON.
Pcm16 = Annotated[
    bytes,
    BeforeValidator(_b64decode),
    PlainSerializer(lambda b: base64.b64encode(b).decode(), return_type=str, when_used="json"),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- the objects events carry ------------------------------------------------------------------


class TokenDetails(_Model):
    text_tokens: int = 0
    audio_tokens: int = 0


class InputTokenDetails(TokenDetails):
    cached_tokens: int = 0


class Usage(_Model):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_token_details: InputTokenDetails = Field(default_factory=InputTokenDetails)
    output_token_details: TokenDetails = Field(default_factory=TokenDetails)


class Content(_Model):
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]
    text: str | None = None
    transcript: str | None = None


class Part(_Model):
    """A content part as the response writes it (`response.content_part.*`)."""

    type: Literal["text", "audio"]
    text: str | None = None
    transcript: str | None = None


class Item(_Model):
    id: str
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] = "realtime.item"
    role: Literal["user", "assistant"]
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[Content]


class FunctionCallItem(_Model):
    """A call the model made (`tools`); the client runs it and answers with a function_call_output."""

    id: str
    type: Literal["function_call"] = "function_call"
    object: Literal["realtime.item"] = "realtime.item"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Model):
    id: str
    type: Literal["function_call_output"] = "function_call_output"
    object: Literal["realtime.item"] = "realtime.item"
    status: Literal["completed"] = "completed"
    call_id: str
    output: str


AnyItem = Annotated[Item | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


# The statuses of a response generated to its end: the model stopped, or `max_output_tokens` did.
WHOLE = ("completed", "incomplete")
# The WebSocket close code of a session refused for now (over a limit, no engine ready): RFC 6455's
# "try again later".
TRY_AGAIN_LATER = 1013


class StatusDetails(_Model):
    """Why a response ended as it did (OpenAI's `status_details`)."""

    type: Literal["completed", "cancelled", "incomplete", "failed"]
    # cancelled: client_cancelled | turn_detected; incomplete: max_output_tokens
    reason: str | None = None
    error: dict[str, str] | None = None  # failed: {type, code}


class Response(_Model):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "incomplete", "failed"]
    status_details: StatusDetails | None = None
    # "auto": written into the session's conversation; None: out of band
    conversation_id: str | None = None
    output_modalities: list[Literal["text", "audio"]] = Field(default_factory=list)
    output: list[AnyItem] = Field(default_factory=list)
    usage: Usage | None = None
    metadata: dict[str, str] | None = None


class Session(SessionConfig):
    """The session's settings as the server holds them, with its id and model."""

    id: str
    object: Literal["realtime.session"] = "realtime.session"
    model: str


class ErrorDetail(_Model):
    type: Literal["invalid_request_error", "authentication_error", "rate_limit_error", "server_error"]
    code: str
    message: str
    param: str | None = None
    event_id: str | None = None  # the client event it answers, when known


class TruncationCost(_Model):
    """omniray's extension to `conversation.item.truncated` after a barge-in."""

    wasted_tokens: int
    generated_tokens: int


# ---- events ------------------------------------------------------------------------------------


class _Event(_Model):
    event_id: str = Field(default_factory=lambda: new_id("event"))


class _ContentPart(_Event):
    """An event about one content part of a response's output item."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class Error(_Event):
    type: Literal["error"] = "error"
    error: ErrorDetail


class SessionCreated(_Event):
    type: Literal["session.created"] = "session.created"
    session: Session


class SessionUpdated(_Event):
    type: Literal["session.updated"] = "session.updated"
    session: Session


class InputAudioBufferCommitted(_Event):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


class InputAudioBufferCleared(_Event):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class InputAudioBufferSpeechStarted(_Event):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class InputAudioBufferSpeechStopped(_Event):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class ConversationItemAdded(_Event):
    type: Literal["conversation.item.added"] = "conversation.item.added"
    previous_item_id: str | None = None
    item: AnyItem


class ConversationItemDone(_Event):
    type: Literal["conversation.item.done"] = "conversation.item.done"
    previous_item_id: str | None = None
    item: AnyItem


class ConversationItemDeleted(_Event):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class OutputAudioBufferCleared(_Event):
    type: Literal["output_audio_buffer.cleared"] = "output_audio_buffer.cleared"
    response_id: str | None = None


class OutputAudioBufferStarted(_Event):
    """WebRTC only (OpenAI's): the response's audio began to play out on the peer connection."""

    type: Literal["output_audio_buffer.started"] = "output_audio_buffer.started"
    response_id: str


class OutputAudioBufferStopped(_Event):
    """WebRTC only (OpenAI's): all of the response's audio has been played out."""

    type: Literal["output_audio_buffer.stopped"] = "output_audio_buffer.stopped"
    response_id: str


class _OutputItem(_Event):
    """An event about one output item of a response."""

    response_id: str
    output_index: int = 0
    item: AnyItem


class ResponseOutputItemAdded(_OutputItem):
    type: Literal["response.output_item.added"] = "response.output_item.added"


class ResponseOutputItemDone(_OutputItem):
    type: Literal["response.output_item.done"] = "response.output_item.done"


class ResponseContentPartAdded(_ContentPart):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    part: Part


class ResponseContentPartDone(_ContentPart):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    part: Part


class ResponseOutputTextDelta(_ContentPart):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str


class ResponseOutputTextDone(_ContentPart):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str


class _FunctionCallArguments(_Event):
    response_id: str
    item_id: str
    output_index: int = 0
    call_id: str


class FunctionCallArgumentsDelta(_FunctionCallArguments):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    delta: str


class FunctionCallArgumentsDone(_FunctionCallArguments):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    name: str
    arguments: str


class RateLimit(_Model):
    # OpenAI's "tokens" is the text-token budget; the others are omniray's budgets by modality
    # (audio_seconds, image_tiles, ...): what the tenant may spend a minute, what is left now.
    name: str
    limit: float
    remaining: float
    reset_seconds: float


class RateLimitsUpdated(_Event):
    type: Literal["rate_limits.updated"] = "rate_limits.updated"
    rate_limits: list[RateLimit]


class _InputTranscription(_Event):
    """An event about the transcription of a committed user turn (`audio.input.transcription`)."""

    item_id: str
    content_index: int = 0


class InputAudioTranscriptionDelta(_InputTranscription):
    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta"
    )
    delta: str


class TranscriptionUsage(_Model):
    type: Literal["duration"] = "duration"
    seconds: float


class InputAudioTranscriptionCompleted(_InputTranscription):
    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed"
    )
    transcript: str
    usage: TranscriptionUsage


class InputAudioTranscriptionFailed(_InputTranscription):
    type: Literal["conversation.item.input_audio_transcription.failed"] = (
        "conversation.item.input_audio_transcription.failed"
    )
    error: ErrorDetail


class ConversationItemRetrieved(_Event):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: AnyItem


class SessionResumed(_Event):
    """omniray's extension: a reconnecting client resumed the session (`session_id` asked at
    connect): the conversation as it was kept, oldest first (docs/realtime.md)."""

    type: Literal["omniray.session.resumed"] = "omniray.session.resumed"
    session_id: str
    items: list[AnyItem]


class SessionMigrate(_Event):
    """omniray's extension: this gateway replica is draining (scale-down, an update). The session
    was saved at its turn boundary and this connection ends; reconnecting with `session_id` resumes
    it on another replica (docs/realtime.md)."""

    type: Literal["omniray.session.migrate"] = "omniray.session.migrate"
    session_id: str
    reason: Literal["server_draining"] = "server_draining"


class ConversationItemTruncated(_Event):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int = 0
    audio_end_ms: int
    omniray: TruncationCost | None = None


class ResponseCreated(_Event):
    type: Literal["response.created"] = "response.created"
    response: Response


class ResponseDone(_Event):
    type: Literal["response.done"] = "response.done"
    response: Response


class ResponseOutputAudioTranscriptDelta(_ContentPart):
    type: Literal["response.output_audio_transcript.delta"] = "response.output_audio_transcript.delta"
    delta: str


class ResponseOutputAudioTranscriptDone(_ContentPart):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class ResponseOutputAudioDelta(_ContentPart):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: Pcm16


class ResponseOutputAudioDone(_ContentPart):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


ServerEvent = Annotated[
    Error
    | SessionCreated
    | SessionUpdated
    | InputAudioBufferCommitted
    | InputAudioBufferCleared
    | InputAudioBufferSpeechStarted
    | InputAudioBufferSpeechStopped
    | ConversationItemAdded
    | ConversationItemDone
    | ConversationItemDeleted
    | OutputAudioBufferCleared
    | OutputAudioBufferStarted
    | OutputAudioBufferStopped
    | ResponseOutputItemAdded
    | ResponseOutputItemDone
    | ResponseContentPartAdded
    | ResponseContentPartDone
    | ResponseOutputTextDelta
    | ResponseOutputTextDone
    | ConversationItemRetrieved
    | ConversationItemTruncated
    | SessionResumed
    | SessionMigrate
    | FunctionCallArgumentsDelta
    | RateLimitsUpdated
    | FunctionCallArgumentsDone
    | InputAudioTranscriptionDelta
    | InputAudioTranscriptionCompleted
    | InputAudioTranscriptionFailed
    | ResponseCreated
    | ResponseDone
    | ResponseOutputAudioTranscriptDelta
    | ResponseOutputAudioTranscriptDone
    | ResponseOutputAudioDelta
    | ResponseOutputAudioDone,
    Field(discriminator="type"),
]
_SERVER = TypeAdapter(ServerEvent)


def error(
    message: str,
    code: str,
    event_id: str | None = None,
    kind: str = "invalid_request_error",
    param: str | None = None,
) -> Error:
    return Error(error=ErrorDetail(type=kind, code=code, message=message, event_id=event_id, param=param))


# ---- JSON --------------------------------------------------------------------------------------


def to_json(event: _Event) -> str:
    return event.model_dump_json()


def parse(data: str | bytes | dict) -> _Event:
    """A server event from its JSON text or decoded JSON (clients; raises pydantic's ValidationError)."""
    return _SERVER.validate_python(data) if isinstance(data, dict) else _SERVER.validate_json(data)
