"""Typed events of the Realtime API (OpenAI Realtime's names and shapes).

Client events are parsed into one class each (a discriminated union on `type`); anything else — bad
JSON, an unknown type, a missing or mistyped field, an oversized audio chunk — becomes a
`RealtimeEventError`, which the session answers with an `error` event before going on. Server events
are in services/realtime/server_events.py.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from services.common import untrusted_json
from services.pipeline.turn import SEED_BOUND
from services.realtime.vad import ServerVad

# One append carries at most this much audio (15 s of 24 kHz pcm16, as base64).
MAX_APPEND_BASE64 = 4 * -(-15 * 24_000 * 2 // 3)
MAX_ID_CHARS = 128  # event and item ids
MAX_INSTRUCTIONS_CHARS = 64 * 1024
MAX_OUTPUT_TOKENS = 2**31 - 1  # the protobuf field's range; the profile's cap is checked on use
Id = Annotated[str, Field(max_length=MAX_ID_CHARS)]
OutputTokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)] | Literal["inf"] | None


class RealtimeEventError(ValueError):
    def __init__(self, message: str, code: str = "invalid_event", event_id: str | None = None):
        super().__init__(message)
        self.code, self.event_id = code, event_id


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")
    event_id: Id | None = None


class AudioFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class AudioInput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: AudioFormat = Field(default_factory=AudioFormat)
    # Server VAD (on by default, as OpenAI's); null: the client commits and asks for responses.
    turn_detection: ServerVad | None = Field(default_factory=ServerVad)


class AudioOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: Annotated[str, Field(max_length=256)] | None = None


class AudioConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


class SessionExtension(BaseModel):
    """omniray's own session settings (`session.omniray`, docs/realtime.md)."""

    model_config = ConfigDict(extra="allow")
    # Prefill the turn while the user speaks (where the profile enables it).
    speculative_prefill: bool = True
    # Every response's sampling seed (the thinker's and the talker's draws): the same conversation
    # gets the same answer and the same speech.
    seed: Annotated[int, Field(ge=-SEED_BOUND, lt=SEED_BOUND)] | None = None


class SessionConfig(BaseModel):
    """The parts of `session` this server honours; the rest is accepted and echoed."""

    model_config = ConfigDict(extra="allow")
    type: Literal["realtime"] = "realtime"
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    output_modalities: list[Literal["text", "audio"]] = Field(default_factory=lambda: ["audio"], max_length=2)
    audio: AudioConfig = Field(default_factory=AudioConfig)
    max_output_tokens: OutputTokens = None
    omniray: SessionExtension = Field(default_factory=SessionExtension)


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionConfig


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str = Field(max_length=MAX_APPEND_BASE64)

    def pcm16(self) -> bytes:
        try:
            raw = base64.b64decode(self.audio, validate=True)
        except binascii.Error as e:
            raise RealtimeEventError(f"audio is not valid base64: {e}", event_id=self.event_id) from None
        if len(raw) % 2:
            raise RealtimeEventError("pcm16 audio must have an even number of bytes", event_id=self.event_id)
        return raw


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ResponseConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    output_modalities: list[Literal["text", "audio"]] | None = Field(default=None, max_length=2)
    max_output_tokens: OutputTokens = None


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseConfig = Field(default_factory=ResponseConfig)


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: Id | None = None


class ConversationItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: Id
    content_index: int = Field(default=0, ge=0, le=MAX_OUTPUT_TOKENS)
    audio_end_ms: int = Field(ge=0, le=MAX_OUTPUT_TOKENS)


class ConversationItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: Id


class PlaybackProgress(_Event):
    """omniray's extension: how much of an assistant item's audio the client has played (the session
    monitor's playback position; OpenAI's protocol has no client event for it)."""

    type: Literal["omniray.playback.progress"]
    item_id: Id
    played_ms: float = Field(ge=0, le=1e12, allow_inf_nan=False)


ClientEvent = Annotated[
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ResponseCreate
    | ResponseCancel
    | ConversationItemTruncate
    | ConversationItemRetrieve
    | PlaybackProgress,
    Field(discriminator="type"),
]
_CLIENT = TypeAdapter(ClientEvent)
CLIENT_TYPES = {
    m.model_fields["type"].annotation.__args__[0]
    for m in (
        SessionUpdate,
        InputAudioBufferAppend,
        InputAudioBufferCommit,
        InputAudioBufferClear,
        ResponseCreate,
        ResponseCancel,
        ConversationItemTruncate,
        ConversationItemRetrieve,
        PlaybackProgress,
    )
}


def parse_client_event(raw: str | bytes | dict) -> Any:
    """One client event — JSON text (WebSocket) or the fields a transport decoded itself (gRPC) —
    or RealtimeEventError saying what is wrong with it."""
    if isinstance(raw, dict):
        data = raw
    else:
        try:
            data = untrusted_json.loads(raw)
        except untrusted_json.JsonLimitError as e:
            raise RealtimeEventError(f"event: {e.message}", code=e.code) from None
    if not isinstance(data, dict):
        raise RealtimeEventError("event must be a JSON object")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    if event_id is not None and len(event_id) > MAX_ID_CHARS:
        raise RealtimeEventError(f"event_id is longer than {MAX_ID_CHARS} characters")
    kind = data.get("type")
    if kind not in CLIENT_TYPES:
        shown = kind[:64] if isinstance(kind, str) else kind if kind is None else type(kind).__name__
        raise RealtimeEventError(f"unknown event type {shown!r}", code="unknown_event", event_id=event_id)
    try:
        return _CLIENT.validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:])
        raise RealtimeEventError(f"{kind}: {where}: {first['msg']}", event_id=event_id) from None
