"""gRPC `omni.v1.Omni` through Serve's gRPC proxy, with stubs generated from protos/."""

from __future__ import annotations

import json
import queue

import grpc
import numpy as np
import pytest
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc

from services.realtime.server_events import WHOLE
from tests.conftest import grpc_channel, png_bytes, until, wav_bytes


@pytest.fixture(scope="module")
def stub(omniray):
    channel = grpc_channel(omniray.grpc_target)
    yield omni_pb2_grpc.OmniStub(channel)
    channel.close()


def _request(model_name, *parts, modalities=("text",), max_tokens=16):
    msg = omni_pb2.Message(role="user", content=list(parts))
    return omni_pb2.ChatRequest(
        model=model_name,
        messages=[msg],
        modalities=list(modalities),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0),
    )


def test_chat_text_stream(stub, model_name):
    chunks = list(stub.Chat(_request(model_name, omni_pb2.ContentPart(text="Hello")), timeout=60))
    text = "".join(c.text for c in chunks if c.WhichOneof("delta") == "text")
    assert text
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 16


def test_chat_audio_out_with_image_and_speech_in(stub, model_name):
    req = _request(
        model_name,
        omni_pb2.ContentPart(text="Describe"),
        omni_pb2.ContentPart(image=omni_pb2.ImagePart(data=png_bytes())),
        omni_pb2.ContentPart(audio=omni_pb2.AudioPart(data=wav_bytes(), format="wav")),
        modalities=("text", "audio"),
    )
    chunks = list(stub.Chat(req, timeout=60))
    audio = [c.audio for c in chunks if c.WhichOneof("delta") == "audio"]
    text = "".join(c.text for c in chunks if c.WhichOneof("delta") == "text")
    assert audio and all(a.sample_rate == 24000 for a in audio)
    pcm = np.frombuffer(b"".join(a.pcm16 for a in audio), dtype="<i2")
    assert len(pcm) == len(text.encode()) * 2 * 480
    # Each spoken piece names its words; together they are the answer.
    assert "".join(a.transcript for a in audio) == text


def test_list_models_and_health(stub, model_name):
    models = stub.ListModels(omni_pb2.ListModelsRequest(), timeout=10)
    assert [m.id for m in models.models] == [model_name]
    assert "audio" in models.models[0].output_modalities
    assert stub.Health(omni_pb2.HealthRequest(), timeout=10).status == "ok"


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda r: setattr(r, "model", "nope"), "does not exist"),
        (lambda r: r.ClearField("messages"), "messages must not be empty"),
        (lambda r: r.modalities.append("video"), "unsupported modalities"),
        (
            lambda r: r.messages[0].content.append(
                omni_pb2.ContentPart(image=omni_pb2.ImagePart(data=b"not an image"))
            ),
            "image could not be decoded",
        ),
        (
            lambda r: r.messages[0].content.append(
                omni_pb2.ContentPart(audio=omni_pb2.AudioPart(data=b"RIFFxx", format="wav"))
            ),
            "audio could not be decoded",
        ),
    ],
)
def test_invalid_argument(stub, model_name, mutate, needle):
    req = _request(model_name, omni_pb2.ContentPart(text="Hello"))
    mutate(req)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Chat(req, timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in e.value.details()
    # ...and the server keeps serving.
    assert list(stub.Chat(_request(model_name, omni_pb2.ContentPart(text="Hi"), max_tokens=2), timeout=30))


class _Outbox:
    """Client events for a bidirectional call, sent when the test puts them."""

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()

    def put(self, **event) -> None:
        self.queue.put(omni_pb2.RealtimeClientEvent(**event))

    def __iter__(self):
        while (event := self.queue.get()) is not None:
            yield event


def test_realtime_session_over_grpc(stub, model_name):
    """The WebSocket's realtime session over `Omni.Realtime`: audio in, audio deltas and transcript
    out, cancel, truncate, a bad event answered with an `error` event (the session goes on)."""
    out = _Outbox()
    events = stub.Realtime(iter(out), timeout=180, metadata=[("x-omniray-model", model_name)])
    seen: list = []
    try:
        assert until(events, "session.created", seen).json
        out.put(session_update=omni_pb2.RealtimeSessionUpdate(
            max_output_tokens=24, turn_detection=omni_pb2.TurnDetection(disabled=True)))  # fmt: skip
        until(events, "session.updated", seen)
        t = np.arange(int(0.6 * 24000)) / 24000
        tone = (np.sin(2 * np.pi * 180 * t) * 8000).astype("<i2").tobytes()
        out.put(input_audio_buffer_append=omni_pb2.InputAudioBufferAppend(audio=tone))
        out.put(input_audio_buffer_commit=omni_pb2.InputAudioBufferCommit())
        out.put(response_create=omni_pb2.ResponseCreate())
        done = until(events, "response.done", seen)
        assert done.response_status in WHOLE and done.usage.completion_tokens > 0
        audio = [e.audio for e in seen if e.type == "response.output_audio.delta"]
        words = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
        assert audio and all(len(a) % 2 == 0 and a for a in audio) and words

        out.put(input_audio_buffer_append=omni_pb2.InputAudioBufferAppend(audio=tone))
        out.put(input_audio_buffer_commit=omni_pb2.InputAudioBufferCommit())
        out.put(response_create=omni_pb2.ResponseCreate(max_output_tokens=400))
        first = until(events, "response.output_audio.delta", seen)
        out.put(response_cancel=omni_pb2.ResponseCancel())
        assert until(events, "response.done", seen).response_status == "cancelled"
        out.put(conversation_item_truncate=omni_pb2.ConversationItemTruncate(item_id=first.item_id))
        assert until(events, "conversation.item.truncated", seen).item_id == first.item_id

        out.put(playback_progress=omni_pb2.PlaybackProgress(item_id="nope", played_ms=5))
        error = until(events, "error", seen)
        assert error.error.code == "item_not_found" and error.error.type == "invalid_request_error"
        out.put(event_id="e1")  # no event at all
        assert until(events, "error", seen).error.event_id == "e1"
        out.put(session_update=omni_pb2.RealtimeSessionUpdate())
        until(events, "session.updated", seen)  # still answering
    finally:
        out.queue.put(None)
        events.cancel()


def resumes_and_answers(stub, metadata: list, session_id: str) -> None:
    """A new `Omni.Realtime` call with `x-omniray-session-id`: the session's question and answer
    come back, and its next response is answered."""
    out, seen = _Outbox(), []
    events = stub.Realtime(iter(out), timeout=180, metadata=[*metadata, ("x-omniray-session-id", session_id)])
    try:
        assert json.loads(until(events, "session.created", seen).json)["session"]["id"] == session_id
        items = json.loads(until(events, "omniray.session.resumed", seen).json)["items"]
        assert [i["role"] for i in items] == ["user", "assistant"]
        out.put(response_create=omni_pb2.ResponseCreate())
        assert until(events, "response.done", seen).response_status in WHOLE
    finally:
        out.queue.put(None)
        events.cancel()


def test_a_realtime_session_resumes_over_grpc(stub, model_name):
    """A gRPC client that reconnects with `x-omniray-session-id` gets its conversation back."""
    out = _Outbox()
    events = stub.Realtime(iter(out), timeout=180, metadata=[("x-omniray-model", model_name)])
    seen: list = []
    try:
        session_id = json.loads(until(events, "session.created", seen).json)["session"]["id"]
        out.put(session_update=omni_pb2.RealtimeSessionUpdate(
            max_output_tokens=4, turn_detection=omni_pb2.TurnDetection(disabled=True)))  # fmt: skip
        until(events, "session.updated", seen)
        tone = (np.sin(2 * np.pi * 180 * np.arange(12000) / 24000) * 8000).astype("<i2").tobytes()
        out.put(input_audio_buffer_append=omni_pb2.InputAudioBufferAppend(audio=tone))
        out.put(input_audio_buffer_commit=omni_pb2.InputAudioBufferCommit())
        out.put(response_create=omni_pb2.ResponseCreate())
        assert until(events, "response.done", seen).response_status in WHOLE
    finally:
        out.queue.put(None)
        events.cancel()
    resumes_and_answers(stub, [("x-omniray-model", model_name)], session_id)
    gone = stub.Realtime(iter([]), timeout=30, metadata=[("x-omniray-session-id", "sess_nothere")])
    with pytest.raises(grpc.RpcError) as refused:
        next(iter(gone))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND and "sess_nothere" in refused.value.details()


def test_realtime_refusals_over_grpc(omniray, stub, model_name):
    unknown = omni_pb2_grpc.OmniStub(grpc_channel(omniray.grpc_target, key="sk-nobody"))
    with pytest.raises(grpc.RpcError) as refused:
        next(iter(unknown.Realtime(iter([]), timeout=30)))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as refused:
        next(iter(stub.Realtime(iter([]), timeout=30, metadata=[("x-omniray-model", "gpt-nothing")])))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND and "gpt-nothing" in refused.value.details()


def test_realtime_over_the_session_limit_is_resource_exhausted(stub):
    """gRPC and WebSocket sessions share the gateway's AIMD admission (tiny admits 4)."""
    held = []
    try:
        for _ in range(8):  # sessions of earlier tests may still be closing: count, do not assume
            out = _Outbox()
            events = stub.Realtime(iter(out), timeout=60)
            try:
                assert next(events).type == "session.created"
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert "session limit" in e.details()
                break
            held.append((out, events))
        else:
            raise AssertionError("no session was refused")
        assert 1 <= len(held) <= 4
    finally:
        for out, events in held:
            out.queue.put(None)
            events.cancel()
