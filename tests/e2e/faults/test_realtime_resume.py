"""A realtime session outlives its connection (services/realtime/continuity.py): a client that
reconnects with its session id gets the conversation back — settings, the items (a user turn's
audio too) — and the next response sends the model the same prompt, so its prefix is found in the
cache, not recomputed. Another tenant cannot resume it; an unknown id is a clear refusal."""

from __future__ import annotations

import base64
import json
import math
import struct
import threading

import pytest
from omni.v1 import omni_pb2, omni_pb2_grpc

from loadtest.clients.realtime_client import RealtimeClient
from services import runtime
from services.app import DEPLOYMENT_NAMES
from services.realtime.codecs import PCM_RATE
from services.realtime.server_events import WHOLE
from tests.conftest import grpc_channel, new_tenant, until
from tests.e2e.test_grpc import _Outbox, resumes_and_answers
from tests.faults import rolled


def _url(omniray, model_name, session_id: str | None = None) -> str:
    url = f"{omniray.http_url.replace('http', 'ws', 1)}/v1/realtime?model={model_name}"
    return url + (f"&session_id={session_id}" if session_id else "")


def _tone(seconds: float) -> bytes:
    n = int(PCM_RATE * seconds)
    return struct.pack(f"<{n}h", *(int(8000 * math.sin(2 * math.pi * 440 * i / PCM_RATE)) for i in range(n)))


def _respond(r: RealtimeClient) -> dict:
    at = r.mark()
    r.send({"type": "response.create"})
    done = r.event(r.wait("response.done", at))["response"]
    assert done["status"] in WHOLE, done
    return done


def test_a_reconnecting_client_resumes_its_conversation(omniray, model_name):
    audio = base64.b64encode(_tone(1.0)).decode()
    first = RealtimeClient(_url(omniray, model_name))
    try:
        session = first.event(first.wait("session.created"))["session"]
        first.send({"type": "session.update", "session": {
            "type": "realtime", "output_modalities": ["text"], "max_output_tokens": 6,
            "instructions": "You are a terse assistant."}})  # fmt: skip
        first.wait("session.updated")
        first.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What is this sound?"}, {"type": "input_audio", "audio": audio}]}})  # fmt: skip
        first.wait("conversation.item.done")
        answer = _respond(first)
        items_before = [first.event(first.wait("conversation.item.done"))["item"]["id"]]
    finally:
        first.close()  # the connection drops
    second = RealtimeClient(_url(omniray, model_name, session["id"]))
    try:
        created = second.event(second.wait("session.created"))["session"]
        assert created["id"] == session["id"]
        assert created["output_modalities"] == ["text"] and created["max_output_tokens"] == 6  # settings kept
        assert created["instructions"] == "You are a terse assistant."
        resumed = second.event(second.wait("omniray.session.resumed"))
        roles = [(i["role"], [c["type"] for c in i["content"]]) for i in resumed["items"]]
        assert roles == [("user", ["input_text", "input_audio"]), ("assistant", ["output_text"])]
        assert resumed["items"][0]["id"] == items_before[0]
        again = _respond(second)
        # the resumed prompt starts with the first one (its audio included): found, not recomputed
        # (measured: 64 of 64 tokens cached on tiny)
        cached = again["usage"]["input_token_details"]["cached_tokens"]
        first_prompt = answer["usage"]
        assert first_prompt["input_token_details"]["audio_tokens"] > 0
        assert cached >= first_prompt["input_tokens"] - 32, (cached, first_prompt)  # all but a partial block
    finally:
        second.close()
    assert not first.malformed and not second.malformed


def _roll_gateway(omniray) -> threading.Thread:
    """A new gateway version applied, on a thread: Serve starts its replica and drains the old one."""
    config = rolled(runtime.applied(omniray), DEPLOYMENT_NAMES["gateway"])
    rolling = threading.Thread(target=runtime.apply, args=(omniray, config), daemon=True)
    rolling.start()
    return rolling


def test_a_session_survives_its_gateway_replica_drain(omniray, model_name):
    """A rolling update of the gateway (its replica drained): the session moves at its turn
    boundary — `omniray.session.migrate`, close 1012 — and its client, reconnecting with the id,
    goes on with the new replica: the conversation intact, the next turn answered."""
    first = RealtimeClient(_url(omniray, model_name))
    try:
        sid = first.event(first.wait("session.created"))["session"]["id"]
        first.send({"type": "session.update", "session": {
            "type": "realtime", "output_modalities": ["text"], "max_output_tokens": 6}})  # fmt: skip
        first.wait("session.updated")
        first.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Name a colour."}]}})  # fmt: skip
        first.wait("conversation.item.done")
        _respond(first)
        items = [first.event(i)["item"]["id"] for i, (_, e) in enumerate(first.events)
                 if e["type"] == "conversation.item.done"]  # fmt: skip
        rolling = _roll_gateway(omniray)
        moved = first.event(first.wait("omniray.session.migrate", timeout=240))
        assert moved["session_id"] == sid and moved["reason"] == "server_draining"
        assert first.wait_closed(10) == 1012
        rolling.join(300)
        assert not rolling.is_alive()
    finally:
        first.close()
    second = RealtimeClient(_url(omniray, model_name, sid))
    try:
        resumed = second.event(second.wait("omniray.session.resumed"))
        assert [i["id"] for i in resumed["items"]] == items  # the question and its answer
        assert [i["role"] for i in resumed["items"]] == ["user", "assistant"]
        second.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Another one."}]}})  # fmt: skip
        second.wait("conversation.item.done")
        assert _respond(second)["output"][0]["content"][0]["type"] == "output_text"
    finally:
        second.close()
    assert not first.malformed and not second.malformed


def test_a_grpc_session_survives_its_gateway_replica_drain(omniray, model_name):
    """The same over `Omni.Realtime`: `omniray.session.migrate`, then the stream ends with OK; a new
    call with `x-omniray-session-id` goes on with the conversation on the new replica."""
    channel = grpc_channel(omniray.grpc_target)
    stub, metadata = omni_pb2_grpc.OmniStub(channel), [("x-omniray-model", model_name)]
    out, seen = _Outbox(), []
    events = stub.Realtime(iter(out), timeout=400, metadata=metadata)
    try:
        sid = json.loads(until(events, "session.created", seen).json)["session"]["id"]
        out.put(session_update=omni_pb2.RealtimeSessionUpdate(
            max_output_tokens=4, output_modalities=["text"], turn_detection=omni_pb2.TurnDetection(disabled=True)))  # fmt: skip
        until(events, "session.updated", seen)
        out.put(input_audio_buffer_append=omni_pb2.InputAudioBufferAppend(audio=_tone(0.5)))
        out.put(input_audio_buffer_commit=omni_pb2.InputAudioBufferCommit())
        out.put(response_create=omni_pb2.ResponseCreate())
        assert until(events, "response.done", seen).response_status in WHOLE
        rolling = _roll_gateway(omniray)
        moved = json.loads(until(events, "omniray.session.migrate", seen).json)
        assert moved["session_id"] == sid and moved["reason"] == "server_draining"
        assert [e.type for e in events] == []  # the stream ends there, with OK (an error would raise)
        rolling.join(300)
        assert not rolling.is_alive()
    finally:
        out.queue.put(None)
        events.cancel()
    try:
        resumes_and_answers(stub, metadata, sid)
    finally:
        channel.close()


def test_resuming_a_live_session_ends_the_old_connection(omniray, model_name):
    old = RealtimeClient(_url(omniray, model_name))
    try:
        sid = old.event(old.wait("session.created"))["session"]["id"]
        old.send({"type": "session.update", "session": {"type": "realtime", "instructions": "kept"}})
        old.wait("session.updated")
        new = RealtimeClient(_url(omniray, model_name, sid))
        try:
            assert new.event(new.wait("session.created"))["session"]["instructions"] == "kept"
            new.wait("omniray.session.resumed")
            assert old.event(old.wait("error"))["error"]["code"] == "session_taken_over"
            assert old.wait_closed(10) == 1000
            at = new.mark()
            new.send({"type": "session.update", "session": {"type": "realtime", "instructions": "new"}})
            new.wait("session.updated", at)  # the new connection goes on
        finally:
            new.close()
    finally:
        old.close()


def _refused(url: str, api_key: str | None = None) -> str:
    """The error code a connection to `url` is refused with (then closed: 1008)."""
    r = RealtimeClient(url, **({"api_key": api_key} if api_key else {}))
    try:
        code = r.event(r.wait("error"))["error"]["code"]
        assert r.wait_closed(10) == 1008
        return code
    finally:
        r.close()


def test_resuming_is_refused_clearly_for_unknown_ids_and_other_tenants(omniray, model_name):
    assert _refused(_url(omniray, model_name, "sess_doesnotexist")) == "session_not_found"
    mine = RealtimeClient(_url(omniray, model_name))
    try:
        sid = mine.event(mine.wait("session.created"))["session"]["id"]
        # another tenant's key never finds it (sessions are saved under their tenant)
        assert _refused(_url(omniray, model_name, sid), new_tenant(omniray)) == "session_not_found"
    finally:
        mine.close()


@pytest.mark.parametrize("bad", ["..%2Fx", "sess_" + "a" * 200, "nope"])
def test_a_malformed_session_id_is_refused(omniray, model_name, bad):
    assert _refused(_url(omniray, model_name, bad)) == "invalid_session_id"
