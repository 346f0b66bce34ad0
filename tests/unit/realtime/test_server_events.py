"""Server events: one definition, two codecs. Every event the server can send comes back equal
through JSON (the WebSocket) and through protobuf (gRPC); the JSON is OpenAI's shape (audio as
base64); the protobuf message carries what clients read on the hot path in its own fields, audio as
raw bytes and only once."""

from __future__ import annotations

import base64
import json
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.realtime import grpc_events
from services.realtime import server_events as se
from services.realtime.events import SessionConfig

IDS = {"response_id": "resp_1", "item_id": "item_2"}
USER = se.Item(id="item_1", role="user", content=[se.Content(type="input_audio")])
SAID = se.Item(id="item_2", role="assistant", status="incomplete",
               content=[se.Content(type="output_audio", transcript="Hello the")])  # fmt: skip
USAGE = se.Usage(input_tokens=3, output_tokens=4, total_tokens=7)
SESSION = se.Session(
    id="sess_1", model="m", **SessionConfig(instructions="be brief").model_dump(exclude={"model"})
)

EXAMPLES = [
    se.error("bad", "invalid_json", "evt_9"),
    se.SessionCreated(session=SESSION),
    se.SessionUpdated(session=SESSION),
    se.InputAudioBufferCommitted(item_id="item_1"),
    se.InputAudioBufferCleared(),
    se.InputAudioBufferSpeechStarted(audio_start_ms=120, item_id="item_1"),
    se.InputAudioBufferSpeechStopped(audio_end_ms=900, item_id="item_1"),
    se.ConversationItemAdded(previous_item_id="item_0", item=USER),
    se.ConversationItemRetrieved(item=SAID),
    se.ConversationItemTruncated(
        item_id="item_2", audio_end_ms=640, omniray=se.TruncationCost(wasted_tokens=5, generated_tokens=9)
    ),  # fmt: skip
    se.ResponseCreated(response=se.Response(id="resp_1", status="in_progress")),
    se.ResponseDone(
        response=se.Response(
            id="resp_1",
            status="cancelled",
            output=[SAID],
            usage=USAGE,
            conversation_id="conv_1",
            status_details=se.StatusDetails(type="cancelled", reason="turn_detected"),
            metadata={"k": "v"},
        )
    ),  # fmt: skip
    se.ResponseOutputAudioTranscriptDelta(delta="Hel", **IDS),
    se.ResponseOutputAudioTranscriptDone(transcript="Hello there", **IDS),
    se.ResponseOutputAudioDelta(delta=b"\x00\x01\xff\x7f", **IDS),
    se.ResponseOutputAudioDone(**IDS),
    se.ConversationItemDone(previous_item_id="item_0", item=USER),
    se.ConversationItemDeleted(item_id="item_1"),
    se.OutputAudioBufferCleared(response_id="resp_1"),
    se.OutputAudioBufferStarted(response_id="resp_1"),
    se.OutputAudioBufferStopped(response_id="resp_1"),
    se.ResponseOutputItemAdded(
        response_id="resp_1", item=se.Item(id="item_2", role="assistant", status="in_progress", content=[])
    ),
    se.ResponseOutputItemDone(response_id="resp_1", item=SAID),
    se.ResponseContentPartAdded(part=se.Part(type="audio", transcript=""), **IDS),
    se.ResponseContentPartDone(part=se.Part(type="text", text="Hello"), **IDS),
    se.ResponseOutputTextDelta(delta="Hel", **IDS),
    se.ResponseOutputTextDone(text="Hello", **IDS),
    se.InputAudioTranscriptionDelta(item_id="item_1", delta=" Hello"),
    se.InputAudioTranscriptionCompleted(
        item_id="item_1", transcript="Hello there.", usage=se.TranscriptionUsage(seconds=1.25)
    ),
    se.InputAudioTranscriptionFailed(
        item_id="item_1", error=se.ErrorDetail(type="server_error", code="stage_unavailable", message="retry")
    ),
    se.RateLimitsUpdated(
        rate_limits=[se.RateLimit(name="tokens", limit=6000, remaining=5800, reset_seconds=2.0)]
    ),
    se.FunctionCallArgumentsDelta(response_id="resp_1", item_id="item_3", call_id="call_1", delta='{"city"'),
    se.FunctionCallArgumentsDone(
        response_id="resp_1", item_id="item_3", call_id="call_1", name="f", arguments="{}"
    ),
    se.SessionResumed(session_id="sess_1", items=[USER, SAID]),
    se.SessionMigrate(session_id="sess_1"),
]


def test_every_server_event_has_an_example():
    union = typing.get_args(typing.get_args(se.ServerEvent)[0])
    assert {type(e) for e in EXAMPLES} == set(union)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.type)
def test_json_and_protobuf_carry_the_same_event(event):
    assert se.parse(se.to_json(event)) == event
    assert se.parse(json.loads(se.to_json(event))) == event
    assert grpc_events.from_proto(grpc_events.to_proto(event)) == event


def test_audio_is_base64_in_json_and_raw_bytes_once_in_protobuf():
    event = se.ResponseOutputAudioDelta(delta=b"\x00\x01", **IDS)
    assert json.loads(se.to_json(event))["delta"] == base64.b64encode(b"\x00\x01").decode()
    message = grpc_events.to_proto(event)
    assert (message.audio, message.response_id, message.item_id, message.json) == (
        b"\x00\x01",
        *IDS.values(),
        "",
    )


def test_protobuf_fields_clients_read_without_the_json():
    done = grpc_events.to_proto(EXAMPLES[11])
    assert (done.response_id, done.response_status, done.usage.total_tokens) == ("resp_1", "cancelled", 7)
    assert (
        done.transcript == "" and json.loads(done.json)["response"]["output"][0]["content"][0]["transcript"]
    )
    err = grpc_events.to_proto(EXAMPLES[0])
    assert (err.error.type, err.error.code, err.error.message, err.error.event_id) == (
        "invalid_request_error", "invalid_json", "bad", "evt_9")  # fmt: skip
    started = grpc_events.to_proto(EXAMPLES[5])
    assert (started.audio_start_ms, started.item_id) == (120, "item_1")
    retrieved = grpc_events.to_proto(EXAMPLES[8])
    assert (retrieved.item_id, retrieved.transcript) == ("item_2", "Hello the")
    delta = grpc_events.to_proto(EXAMPLES[12])
    assert (delta.delta, delta.response_id) == ("Hel", "resp_1")


def test_json_is_openais_shape():
    body = json.loads(se.to_json(EXAMPLES[11]))
    assert body["type"] == "response.done" and body["event_id"].startswith("event_")
    assert body["response"] == {
        "id": "resp_1", "object": "realtime.response", "status": "cancelled", "usage": USAGE.model_dump(),
        "status_details": {"type": "cancelled", "reason": "turn_detected", "error": None},
        "conversation_id": "conv_1", "output_modalities": [], "metadata": {"k": "v"},
        "output": [{"id": "item_2", "type": "message", "object": "realtime.item", "role": "assistant",
                    "status": "incomplete",
                    "content": [{"type": "output_audio", "text": None, "transcript": "Hello the"}]}],
    }  # fmt: skip
    assert set(body["response"]["usage"]["input_token_details"]) == {
        "text_tokens",
        "audio_tokens",
        "cached_tokens",
    }
    error = json.loads(se.to_json(EXAMPLES[0]))["error"]
    assert error == {"type": "invalid_request_error", "code": "invalid_json", "message": "bad", "param": None,
                     "event_id": "evt_9"}  # fmt: skip
    session = json.loads(se.to_json(EXAMPLES[1]))["session"]
    assert (session["object"], session["id"], session["instructions"]) == (
        "realtime.session",
        "sess_1",
        "be brief",
    )


@given(pcm=st.binary(max_size=4096), text=st.text(max_size=200))
def test_any_audio_and_text_survive_both_codecs(pcm, text):
    for event in (
        se.ResponseOutputAudioDelta(delta=pcm, **IDS),
        se.ResponseOutputAudioTranscriptDelta(delta=text, **IDS),
    ):
        assert se.parse(se.to_json(event)) == event
        assert grpc_events.from_proto(grpc_events.to_proto(event)) == event
