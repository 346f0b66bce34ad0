"""Realtime events on the gRPC stream. Client events from protobuf (`omni.v1.RealtimeClientEvent`)
into the event shapes of OpenAI Realtime, so the gRPC stream and the WebSocket drive one session
class and one event model (`services/realtime/events.py`): a client event's fields go to the typed
parser as they are (no JSON text in between). Server events (services/realtime/server_events.py)
into `omni.v1.RealtimeServerEvent` (`to_proto`) and back (`from_proto`, for clients): the message
has fields for what a client reads often (type, ids, transcript, status, usage, error) and audio as
raw bytes; the whole event rides in `json`, except audio deltas."""

from __future__ import annotations

from google.protobuf import json_format
from omni.v1 import common_pb2, omni_pb2

from services.realtime import server_events as se

# oneof field -> OpenAI event type
_CLIENT_TYPES = {
    "session_update": "session.update",
    "input_audio_buffer_append": "input_audio_buffer.append",
    "input_audio_buffer_commit": "input_audio_buffer.commit",
    "input_audio_buffer_clear": "input_audio_buffer.clear",
    "response_create": "response.create",
    "response_cancel": "response.cancel",
    "conversation_item_truncate": "conversation.item.truncate",
    "conversation_item_retrieve": "conversation.item.retrieve",
    "playback_progress": "omniray.playback.progress",
}


def client_event(msg: omni_pb2.RealtimeClientEvent) -> dict | str:
    """The client event's fields as the WebSocket's JSON would carry them (an event without a oneof
    is unknown), or the JSON text itself (`openai_json`)."""
    which = msg.WhichOneof("event")
    if which == "openai_json":
        return msg.openai_json
    fields = json_format.MessageToDict(
        getattr(msg, which), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    ) if which else {}  # fmt: skip
    if which == "session_update":
        fields = _session(msg.session_update)
    elif which == "response_create":
        fields = {"response": fields}
    event = {"type": _CLIENT_TYPES.get(which, "unknown"), **fields}
    if msg.event_id:
        event["event_id"] = msg.event_id
    return event


def _session(update: omni_pb2.RealtimeSessionUpdate) -> dict:
    session: dict = {"type": "realtime"}
    for name in ("instructions", "max_output_tokens"):
        if update.HasField(name):
            session[name] = getattr(update, name)
    if update.output_modalities:
        session["output_modalities"] = list(update.output_modalities)
    audio: dict = {}
    if update.HasField("voice"):
        audio["output"] = {"voice": update.voice}
    if update.HasField("turn_detection"):
        td = json_format.MessageToDict(update.turn_detection, preserving_proto_field_name=True)
        disabled = td.pop("disabled", False)
        audio["input"] = {"turn_detection": None if disabled else {"type": "server_vad", **td}}
    if audio:
        session["audio"] = audio
    return {"session": session}


_SCALARS = ("response_id", "item_id", "transcript", "audio_start_ms", "audio_end_ms")


def to_proto(event: se.ServerEvent) -> omni_pb2.RealtimeServerEvent:
    out = omni_pb2.RealtimeServerEvent(type=event.type, event_id=event.event_id)
    for name in _SCALARS:
        if isinstance(value := getattr(event, name, None), str | int):
            setattr(out, name, value)
    delta = getattr(event, "delta", None)
    if isinstance(delta, bytes):
        out.audio = delta
    elif isinstance(delta, str):
        out.delta = delta
    if (response := getattr(event, "response", None)) is not None:
        out.response_id, out.response_status = response.id, response.status
        if response.usage is not None:
            u = response.usage
            out.usage.CopyFrom(common_pb2.Usage(prompt_tokens=u.input_tokens, completion_tokens=u.output_tokens,
                                                total_tokens=u.total_tokens))  # fmt: skip
    if (item := getattr(event, "item", None)) is not None:
        out.item_id = item.id
        out.transcript = next((c.transcript or c.text or "" for c in getattr(item, "content", ())), "")
    if isinstance(event, se.Error):
        e = event.error
        out.error.CopyFrom(omni_pb2.RealtimeError(type=e.type, code=e.code, message=e.message,
                                                  event_id=e.event_id or ""))  # fmt: skip
    if not isinstance(delta, bytes):  # audio goes as bytes only, not twice
        out.json = se.to_json(event)
    return out


def from_proto(message: omni_pb2.RealtimeServerEvent) -> se.ServerEvent:
    """The event a `to_proto` message carries (clients)."""
    if message.type == se.ResponseOutputAudioDelta.model_fields["type"].default:
        return se.ResponseOutputAudioDelta(event_id=message.event_id, response_id=message.response_id,
                                        item_id=message.item_id, delta=message.audio)  # fmt: skip
    return se.parse(message.json)
