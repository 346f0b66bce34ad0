"""Realtime client events from protobuf: every client message parses into the same typed event the
WebSocket gives (server events: test_server_events.py)."""

from __future__ import annotations

import pytest
from omni.v1 import omni_pb2

from services.realtime import events as ev
from services.realtime.grpc_events import client_event

E = omni_pb2.RealtimeClientEvent


@pytest.mark.parametrize(
    ("message", "kind", "check"),
    [
        (E(input_audio_buffer_append=omni_pb2.InputAudioBufferAppend(audio=b"\x01\x02")),
         ev.InputAudioBufferAppend, lambda e: e.data() == b"\x01\x02"),
        (E(input_audio_buffer_commit=omni_pb2.InputAudioBufferCommit()), ev.InputAudioBufferCommit, None),
        (E(input_audio_buffer_clear=omni_pb2.InputAudioBufferClear()), ev.InputAudioBufferClear, None),
        (E(response_create=omni_pb2.ResponseCreate(max_output_tokens=7)), ev.ResponseCreate,
         lambda e: e.response.max_output_tokens == 7),
        (E(response_cancel=omni_pb2.ResponseCancel()), ev.ResponseCancel, None),
        (E(conversation_item_truncate=omni_pb2.ConversationItemTruncate(item_id="i")),  # zero: still sent
         ev.ConversationItemTruncate, lambda e: e.audio_end_ms == 0),
        (E(conversation_item_retrieve=omni_pb2.ConversationItemRetrieve(item_id="i")),
         ev.ConversationItemRetrieve, None),
        (E(playback_progress=omni_pb2.PlaybackProgress(item_id="i", played_ms=250)), ev.PlaybackProgress,
         lambda e: e.played_ms == 250),
        (E(session_update=omni_pb2.RealtimeSessionUpdate(
            voice="v", turn_detection=omni_pb2.TurnDetection(disabled=True))), ev.SessionUpdate,
         lambda e: e.session["audio"] == {"output": {"voice": "v"}, "input": {"turn_detection": None}}),
        (E(session_update=omni_pb2.RealtimeSessionUpdate(
            turn_detection=omni_pb2.TurnDetection(silence_duration_ms=300))), ev.SessionUpdate,
         lambda e: e.session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 300),
        (E(openai_json='{"type": "conversation.item.delete", "item_id": "i", "event_id": "e1"}'),
         ev.ConversationItemDelete, lambda e: e.item_id == "i"),
    ],
)  # fmt: skip
def test_client_messages_parse_as_the_websocket_events(message, kind, check):
    message.event_id = "e1"
    event = ev.parse_client_event(client_event(message))
    assert isinstance(event, kind) and event.event_id == "e1"
    assert check is None or check(event)


def test_session_update_leaves_unset_fields_out():
    session = client_event(E(session_update=omni_pb2.RealtimeSessionUpdate()))["session"]
    assert session == {"type": "realtime"}  # merged into the session: nothing changes


def test_a_message_without_an_event_is_an_unknown_event():
    with pytest.raises(ev.RealtimeEventError) as e:
        ev.parse_client_event(client_event(E(event_id="e9")))
    assert e.value.code == "unknown_event" and e.value.event_id == "e9"
