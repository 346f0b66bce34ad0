"""Typed events of the Realtime API (OpenAI Realtime's names and shapes).

Client events are parsed into one class each (a discriminated union on `type`); anything else — bad
JSON, an unknown type, a missing or mistyped field, an oversized audio chunk — becomes a
`RealtimeEventError`, which the session answers with an `error` event before going on. Server events
are in services/realtime/server_events.py.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from services.common import untrusted_json
from services.pipeline.turn import SEED_BOUND
from services.realtime.vad import ServerVad

# One append carries at most this much audio (15 s of 24 kHz pcm16, as base64).
MAX_APPEND_BASE64 = 4 * -(-15 * 24_000 * 2 // 3)
# An image part's data: URL: base64 of the largest image a profile takes (its limit is checked too).
MAX_IMAGE_URL_CHARS = 4 * -(-20 * 1024 * 1024 // 3) + 64
MAX_ID_CHARS = 128  # event and item ids
MAX_INSTRUCTIONS_CHARS = 64 * 1024
MAX_OUTPUT_TOKENS = 2**31 - 1  # the protobuf field's range; the profile's cap is checked on use
MAX_ITEM_TEXT_CHARS = 64 * 1024  # one content part's text
MAX_CONTENT_PARTS = 8
MAX_RESPONSE_INPUT_ITEMS = 64
MAX_TOOLS = 128  # OpenAI's
MAX_TOOL_TEXT_CHARS = 64 * 1024  # a call's arguments, a call's output
# A session's settings as JSON, however many updates built them (unknown keys are kept and echoed,
# as OpenAI's are): instructions (64 KiB) and tools fit. A client secret's are kept in Redis too.
MAX_SESSION_BYTES = 256 * 1024
Id = Annotated[str, Field(max_length=MAX_ID_CHARS)]
FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
ItemText = Annotated[str, Field(max_length=MAX_ITEM_TEXT_CHARS)]
OutputTokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)] | Literal["inf"] | None


class RealtimeEventError(ValueError):
    def __init__(self, message: str, code: str = "invalid_event", event_id: str | None = None):
        super().__init__(message)
        self.code, self.event_id = code, event_id


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")
    event_id: Id | None = None


class FunctionTool(BaseModel):
    """A function the model may call (`session.tools`, `response.tools`)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    name: FunctionName
    description: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] = ""
    parameters: dict[str, Any] | None = None


class NamedTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: FunctionName


ToolChoice = Literal["auto", "none", "required"] | NamedTool
Tools = Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)]


class AudioFormat(BaseModel):
    """pcm16 at 24 kHz, or G.711 μ-law / A-law at 8 kHz (telephony; services/realtime/codecs.py)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: Literal[24000] | None = 24000  # audio/pcm's (the only rate it takes); none for G.711

    @model_validator(mode="after")
    def _rate(self) -> AudioFormat:
        self.rate = 24000 if self.type == "audio/pcm" else None
        return self


class InputTranscription(BaseModel):
    """`audio.input.transcription`: each committed turn transcribed beside the response by the
    profile's transcriber (whatever `model` names: the deployment has one)."""

    model_config = ConfigDict(extra="ignore")
    model: Annotated[str, Field(max_length=256)] | None = None
    language: Annotated[str, Field(max_length=16)] | None = None
    prompt: Annotated[str, Field(max_length=4096)] | None = None


class AudioInput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: AudioFormat = Field(default_factory=AudioFormat)
    # Server VAD (on by default, as OpenAI's); null: the client commits and asks for responses.
    turn_detection: ServerVad | None = Field(default_factory=ServerVad)
    # null (the default): committed turns are not transcribed
    transcription: InputTranscription | None = None


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
    # The model the client names (frameworks send theirs): one this deployment serves, or refused.
    model: Annotated[str, Field(max_length=256)] | None = None
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    output_modalities: list[Literal["text", "audio"]] = Field(default_factory=lambda: ["audio"], max_length=2)
    audio: AudioConfig = Field(default_factory=AudioConfig)
    max_output_tokens: OutputTokens = None
    tools: Tools = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    omniray: SessionExtension = Field(default_factory=SessionExtension)


class SessionUpdate(_Event):
    type: Literal["session.update"]
    # Validated field by field against the session's settings (`updated`): what does not
    # validate is reported and left as it was, the rest applies.
    session: dict[str, Any]


def updated(current: SessionConfig, given: dict) -> tuple[SessionConfig, dict, list[tuple[tuple, str]]]:
    """`given` over `current`, as OpenAI's `session.update` (fields not given keep their values),
    with the fields that do not validate left as they were: the settings, what of `given` applied,
    and (location, why) of each field refused."""
    refused: list[tuple[tuple, str]] = []
    while True:
        try:
            return SessionConfig.model_validate(merge(current.model_dump(), given)), given, refused
        except ValidationError as e:
            first = e.errors()[0]
            loc, why = tuple(first["loc"]), first["msg"]
            refused.append((loc, why))
            smaller = without(given, loc)
            if smaller == given:  # not a field the client gave (cannot happen): nothing applies
                return current, {}, refused
            given = smaller


def merge(base: dict, given: dict) -> dict:
    out = dict(base)
    for key, value in given.items():
        out[key] = (
            merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
        )
    return out


def without(given: dict, loc: tuple) -> dict:
    """`given` less the field at `loc` (the deepest part of it that `given` holds)."""
    if not loc or not isinstance(given, dict) or loc[0] not in given:
        return given
    rest = given[loc[0]]
    if len(loc) > 1 and isinstance(rest, dict) and loc[1] in rest:
        return {**given, loc[0]: without(rest, loc[1:])}
    return {k: v for k, v in given.items() if k != loc[0]}


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str = Field(max_length=MAX_APPEND_BASE64)

    def data(self) -> bytes:
        """The audio's bytes, in the session's input format (services/realtime/codecs.py)."""
        return _b64(self.audio, self.event_id)


class InputImageBufferAppend(_Event):
    """omniray's extension: a camera frame (a data: URL, PNG or JPEG) shown now; the session holds
    recent key frames for the next committed turn (services/realtime/camera.py)."""

    type: Literal["input_image_buffer.append"]
    image_url: str = Field(max_length=MAX_APPEND_BASE64)


def _b64(audio: str, event_id: str | None) -> bytes:
    try:
        return base64.b64decode(audio, validate=True)
    except ValueError:  # binascii.Error, or characters outside ASCII
        raise RealtimeEventError("audio is not valid base64", event_id=event_id) from None


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ContentPartIn(BaseModel):
    """One content part of an item a client adds: user text, audio (base64 pcm16, 24 kHz) or an
    image (a data: URL, as OpenAI's `input_image`), or an assistant's text (or the transcript of its
    audio)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio", "text", "audio"]
    text: ItemText | None = None
    audio: Annotated[str, Field(max_length=MAX_APPEND_BASE64)] | None = None
    transcript: ItemText | None = None
    image_url: Annotated[str, Field(max_length=MAX_IMAGE_URL_CHARS)] | None = None
    detail: Literal["auto", "low", "high"] = "auto"

    def data(self, event_id: str | None) -> bytes:
        return _b64(self.audio or "", event_id)


class ItemIn(BaseModel):
    """A conversation item from the client (`conversation.item.create`, `response.create`'s
    `input`). Which combinations the session takes is its to say (RealtimeSession._item)."""

    model_config = ConfigDict(extra="allow")
    id: Id | None = None
    type: Literal["message", "function_call", "function_call_output", "item_reference"] = "message"
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPartIn] = Field(default_factory=list, max_length=MAX_CONTENT_PARTS)
    # function_call / function_call_output
    call_id: Id | None = None
    name: FunctionName | None = None
    arguments: Annotated[str, Field(max_length=MAX_TOOL_TEXT_CHARS)] | None = None
    output: Annotated[str, Field(max_length=MAX_TOOL_TEXT_CHARS)] | None = None


# OpenAI's metadata: at most 16 pairs, keys up to 64 characters, values up to 512.
Metadata = dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]]


class ResponseConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    output_modalities: list[Literal["text", "audio"]] | None = Field(default=None, max_length=2)
    max_output_tokens: OutputTokens = None
    # "none": out of band, not written into the conversation (answers `input` when given)
    conversation: Literal["auto", "none"] = "auto"
    input: list[ItemIn] | None = Field(default=None, max_length=MAX_RESPONSE_INPUT_ITEMS)
    metadata: Annotated[Metadata, Field(max_length=16)] | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None


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


class ConversationItemCreate(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: Id | None = None  # after this item ("root": first); default: last
    item: ItemIn


class ConversationItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: Id


class OutputAudioBufferClear(_Event):
    """Stop the response's audio (OpenAI's for WebRTC; here any transport): the response is
    cancelled and the assistant's item cut to what was played."""

    type: Literal["output_audio_buffer.clear"]


class PlaybackProgress(_Event):
    """omniray's extension: how much of an assistant item's audio the client has played (the session
    monitor's playback position; OpenAI's protocol has no client event for it)."""

    type: Literal["omniray.playback.progress"]
    item_id: Id
    played_ms: float = Field(ge=0, le=1e12, allow_inf_nan=False)


ClientEvent = Annotated[
    SessionUpdate
    | InputAudioBufferAppend
    | InputImageBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ResponseCreate
    | ResponseCancel
    | ConversationItemTruncate
    | ConversationItemRetrieve
    | ConversationItemCreate
    | ConversationItemDelete
    | OutputAudioBufferClear
    | PlaybackProgress,
    Field(discriminator="type"),
]
_CLIENT = TypeAdapter(ClientEvent)
CLIENT_TYPES = {
    m.model_fields["type"].annotation.__args__[0]
    for m in (
        SessionUpdate,
        InputAudioBufferAppend,
        InputImageBufferAppend,
        InputAudioBufferCommit,
        InputAudioBufferClear,
        ResponseCreate,
        ResponseCancel,
        ConversationItemTruncate,
        ConversationItemRetrieve,
        ConversationItemCreate,
        ConversationItemDelete,
        OutputAudioBufferClear,
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
