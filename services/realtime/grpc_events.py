"""Realtime client events from protobuf (`omni.v1.RealtimeClientEvent`) into the event shapes of
OpenAI Realtime, so the gRPC stream and the WebSocket drive one session class and one event model
(`services/realtime/events.py`): a client event's fields go to the typed parser as they are (no JSON
text in between). Server events carry their own codecs (services/realtime/server_events.py)."""

from __future__ import annotations

from google.protobuf import json_format
from omni.v1 import omni_pb2

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
