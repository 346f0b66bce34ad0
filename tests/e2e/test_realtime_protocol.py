"""The realtime conversation protocol as OpenAI's clients and voice-agent frameworks drive it, with the
official SDK (raw events where it has no helper) on the tiny deployment: sessions driven by
`conversation.item.create` alone, the assistant item's lifecycle events in OpenAI's order, a bot
that speaks first, out-of-band responses, item insert / delete, cancel and clear, usage and
status details on every `response.done`, and `session.update` applied field by field."""

from __future__ import annotations

import base64
import json

import numpy as np

from services.realtime.server_events import WHOLE
from tests.conftest import until

PCM_RATE = 24000
TEXT_ONLY = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, "output_modalities": ["text"]}
LIFECYCLE = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def _open(client, **session):
    conn = client.realtime.connect(model="omniray-tiny").enter()
    seen: list = []
    until(conn, "session.created", seen)
    conn.session.update(session={**TEXT_ONLY, **session})
    until(conn, "session.updated", seen)
    return conn


def _say(conn, text: str, role: str = "user", **extra) -> object:
    kind = "input_text" if role == "user" else "output_text"
    conn.send_raw(json.dumps({"type": "conversation.item.create", **extra,
                              "item": {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}}))  # fmt: skip
    seen: list = []
    added = until(conn, "conversation.item.added", seen)
    assert until(conn, "conversation.item.done", seen).item.id == added.item.id
    return added


def _respond(conn, **response) -> tuple[object, list]:
    conn.send_raw(json.dumps({"type": "response.create", "response": response}))
    seen: list = []
    return until(conn, "response.done", seen), seen


def test_a_session_driven_only_by_text_items(openai_client):
    conn = _open(openai_client, max_output_tokens=8)
    try:
        user = _say(conn, "Hello there, who are you?")
        assert user.item.role == "user" and user.item.content[0].text == "Hello there, who are you?"
        done, seen = _respond(conn)
        kinds = [e.type for e in seen]
        assert [k for k in LIFECYCLE if k in kinds] == LIFECYCLE, kinds
        assert [kinds.index(k) for k in LIFECYCLE] == sorted(kinds.index(k) for k in LIFECYCLE)
        text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
        r = done.response
        assert r.status == "incomplete" and r.status_details.reason == "max_output_tokens"  # 8 of 8
        assert r.output[0].content[0].type == "output_text" and r.output[0].content[0].text == text
        assert r.usage.output_tokens == 8 and r.usage.input_tokens > 0
        assert r.usage.input_token_details.text_tokens == r.usage.input_tokens
        added = next(e for e in seen if e.type == "conversation.item.added")
        assert added.previous_item_id == user.item.id and added.item.status == "in_progress"

        _say(conn, "And what can you do?")
        again, _ = _respond(conn)
        assert again.response.usage.input_tokens > r.usage.input_tokens  # the first turn is in it
    finally:
        conn.close()


def test_the_bot_speaks_first_from_its_instructions(openai_client):
    conn = _open(
        openai_client, instructions="Greet the caller.", output_modalities=["audio"], max_output_tokens=8
    )
    try:
        done, seen = _respond(conn)
        assert done.response.status in WHOLE
        assert [e for e in seen if e.type == "response.output_audio.delta"]
        part = next(e for e in seen if e.type == "response.content_part.done").part
        assert part.type == "audio" and part.transcript
    finally:
        conn.close()


def test_nothing_to_respond_to_is_an_error_and_the_session_goes_on(openai_client):
    conn = _open(openai_client)
    try:
        conn.send_raw(json.dumps({"type": "response.create", "event_id": "e1"}))
        error = until(conn, "error", [])
        assert error.error.event_id == "e1" and "nothing to respond to" in error.error.message
        _say(conn, "Hi")
    finally:
        conn.close()


def test_an_out_of_band_response_stays_out_of_the_conversation(openai_client):
    conn = _open(openai_client, max_output_tokens=6)
    try:
        _say(conn, "Tell me about the sea.")
        question = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Classify it."}],
        }
        done, seen = _respond(conn, conversation="none", input=[question], metadata={"purpose": "classify"})
        r = done.response
        assert r.status in WHOLE and r.metadata == {"purpose": "classify"} and r.conversation_id is None
        assert not [e for e in seen if e.type.startswith("conversation.item.")]
        conn.send_raw(json.dumps({"type": "conversation.item.retrieve", "item_id": r.output[0].id}))
        assert until(conn, "error", []).error.code == "item_not_found"
        # referenced items: the conversation's own, read but not changed
        main, _ = _respond(conn)
        assert main.response.conversation_id and main.response.metadata is None
    finally:
        conn.close()


def test_items_are_inserted_retrieved_and_deleted(openai_client):
    conn = _open(openai_client)
    try:
        first = _say(conn, "first")
        root = _say(conn, "zeroth", previous_item_id="root")
        assert root.previous_item_id is None
        after = _say(conn, "an answer", role="assistant", previous_item_id=first.item.id)
        assert after.previous_item_id == first.item.id and after.item.content[0].type == "output_text"
        conn.send_raw(json.dumps({"type": "conversation.item.delete", "item_id": first.item.id}))
        assert until(conn, "conversation.item.deleted", []).item_id == first.item.id
        for item_id, code in ((first.item.id, "item_not_found"), (root.item.id, None)):
            conn.send_raw(json.dumps({"type": "conversation.item.retrieve", "item_id": item_id}))
            event = until(conn, "error" if code else "conversation.item.retrieved", [])
            assert (event.error.code if code else event.item.content[0].text) == (code or "zeroth")
    finally:
        conn.close()


def test_a_user_audio_item_is_heard_and_counted(openai_client):
    conn = _open(openai_client, max_output_tokens=4)
    try:
        t = np.arange(int(0.6 * PCM_RATE)) / PCM_RATE
        audio = base64.b64encode((np.sin(2 * np.pi * 200 * t) * 8000).astype("<i2").tobytes()).decode()
        conn.send_raw(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}}))  # fmt: skip
        assert until(conn, "conversation.item.done", []).item.content[0].type == "input_audio"
        done, _ = _respond(conn)
        assert done.response.usage.input_token_details.audio_tokens >= 10  # 0.6 s: 15 audio rows on tiny
    finally:
        conn.close()


def test_cancel_and_clear_end_a_response_with_usage_and_details(openai_client):
    conn = _open(openai_client, output_modalities=["audio"], max_output_tokens=1000)
    try:
        conn.send_raw(json.dumps({"type": "response.cancel", "event_id": "c0"}))
        assert until(conn, "error", []).error.code == "response_cancel_not_active"
        _say(conn, "Tell me a long story.")
        for stop, reason in (
            ("response.cancel", "client_cancelled"),
            ("output_audio_buffer.clear", "client_cancelled"),
        ):
            conn.send_raw(json.dumps({"type": "response.create"}))
            seen: list = []
            until(conn, "response.output_audio.delta", seen)
            conn.send_raw(json.dumps({"type": stop}))
            done = until(conn, "response.done", seen)
            r = done.response
            assert r.status == "cancelled" and r.status_details.reason == reason, stop
            assert r.usage.output_tokens > 0 and r.output[0].status == "incomplete"
            if stop == "output_audio_buffer.clear":  # after the response stopped
                assert until(conn, "output_audio_buffer.cleared", seen).response_id == r.id
    finally:
        conn.close()


def test_session_update_applies_what_it_can_field_by_field(openai_client):
    conn = _open(openai_client)
    try:
        conn.send_raw(json.dumps({"type": "session.update", "event_id": "u1", "session": {
            "instructions": "Be brief.", "output_modalities": ["smell"],
            "audio": {"output": {"voice": "nobody"}, "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}},
        }}))  # fmt: skip
        seen: list = []
        updated = until(conn, "session.updated", seen).session
        errors = {e.error.param for e in seen if e.type == "error"}
        assert errors == {"session.output_modalities.0", "session.audio.output.voice"}
        assert updated.instructions == "Be brief." and updated.output_modalities == ["text"]
        assert updated.audio.input.turn_detection.type == "semantic_vad"
    finally:
        conn.close()


def test_a_telephony_session_speaks_g711_both_ways(openai_client):
    """audio/pcmu in and out (G.711 μ-law, 8 kHz): a phone bridge's session, converted at the edge."""
    from services.realtime.codecs import G711_RATE, InputAudio, OutputAudio

    g711 = {"type": "audio/pcmu"}
    conn = _open(openai_client, output_modalities=["audio"], max_output_tokens=8,
                 audio={"input": {"turn_detection": None, "format": g711}, "output": {"format": g711}})  # fmt: skip
    try:
        t = np.arange(int(0.6 * PCM_RATE)) / PCM_RATE
        tone = (np.sin(2 * np.pi * 200 * t) * 8000).astype("<i2").tobytes()
        wire = OutputAudio("audio/pcmu").encode(tone)
        conn.send_raw(
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(wire).decode()})
        )
        conn.send_raw(json.dumps({"type": "input_audio_buffer.commit"}))
        done, seen = _respond(conn)
        assert done.response.status in WHOLE
        assert done.response.usage.input_token_details.audio_tokens >= 10  # 0.6 s heard at 24 kHz
        out = b"".join(base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta")
        assert out
        pcm = np.frombuffer(InputAudio("audio/pcmu").decode(out), "<i2")
        assert abs(len(out) / G711_RATE - len(pcm) / PCM_RATE) < 0.01 and np.abs(pcm).max() > 0
    finally:
        conn.close()


def test_session_update_may_name_the_model_and_server_fields(openai_client):
    """Frameworks send their model name (and some echo `id` / `object`) in `session.update`: a served
    name applies, the server's own fields stay the server's."""
    conn = _open(openai_client, model="gpt-realtime", id="sess_mine", object="x")
    try:
        seen: list = []
        conn.session.update(
            session={"type": "realtime", "instructions": "be brief", "model": "gpt-realtime-2.1"}
        )
        updated = until(conn, "session.updated", seen).session
        assert (
            updated.model == "omniray-tiny"
            and updated.id != "sess_mine"
            and updated.instructions == "be brief"
        )
    finally:
        conn.close()


def test_committed_turns_are_transcribed_beside_the_response(openai_client):
    """`audio.input.transcription`: the committed turn's transcript (the tiny profile's Whisper
    beside its random encoders) as deltas, then `.completed`, kept on the item; a language the
    transcriber lacks is refused field by field."""
    import shutil

    import pytest

    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng to speak the turn")
    from loadtest.clients.speech import speech

    # Whisper tiny.en hears espeak's voice resampled twice (22.05 -> 24 -> 16 kHz) well on this one
    question = "How do I make a cup of green tea?"
    conn = _open(
        openai_client, audio={"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}}
    )
    try:
        seen: list = []
        conn.send_raw(json.dumps({"type": "session.update",
                                  "session": {"type": "realtime", "audio": {"input": {"transcription": {"language": "fr"}}}}}))  # fmt: skip
        error = until(conn, "error", seen)
        assert error.error.param == "session.audio.input.transcription" and "fr" in error.error.message
        assert until(conn, "session.updated", seen).session.audio.input.transcription.language is None

        conn.input_audio_buffer.append(audio=base64.b64encode(speech(question)).decode())
        conn.input_audio_buffer.commit()
        committed = until(conn, "input_audio_buffer.committed", seen)
        completed = until(conn, "conversation.item.input_audio_transcription.completed", seen)
        assert completed.item_id == committed.item_id
        words = " ".join("".join(c for c in completed.transcript.lower() if c.isalnum() or c == " ").split())
        assert words == "how do i make a cup of green tea"
        deltas = [e.delta for e in seen if e.type == "conversation.item.input_audio_transcription.delta"]
        assert "".join(deltas) == completed.transcript and completed.usage.seconds > 1.0
        conn.send_raw(json.dumps({"type": "conversation.item.retrieve", "item_id": committed.item_id}))
        item = until(conn, "conversation.item.retrieved", seen).item
        assert item.content[0].type == "input_audio" and item.content[0].transcript == completed.transcript
    finally:
        conn.close()


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def test_a_tool_round_trip_in_a_session(openai_client):
    """session.tools with a required call: the response is a function_call item (arguments streamed,
    following the tool's parameters); the client's function_call_output goes into the conversation
    and the next response answers from it. `tool_choice: auto` (tiny's model has no call format:
    answered as structured output) is taken too."""
    conn = _open(openai_client, max_output_tokens=24)
    try:
        seen: list = []
        conn.session.update(session={"type": "realtime", "tools": [WEATHER_TOOL]})  # tool_choice stays "auto"
        assert len(until(conn, "session.updated", seen).session.tools) == 1
        conn.session.update(session={"type": "realtime", "tools": [WEATHER_TOOL], "tool_choice": "required"})
        assert len(until(conn, "session.updated", seen).session.tools) == 1

        _say(conn, "What's the weather in Paris?")
        done, seen = _respond(conn, max_output_tokens=96)  # room for the whole call
        kinds = [e.type for e in seen]
        order = ["response.created", "response.output_item.added", "conversation.item.added",
                 "response.function_call_arguments.delta", "response.function_call_arguments.done",
                 "response.output_item.done", "conversation.item.done", "response.done"]  # fmt: skip
        assert [k for k in kinds if k in order] == order, kinds
        (call,) = done.response.output
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id
        assert json.loads(call.arguments)["city"] in ("Paris", "Oslo")
        arguments = next(e for e in seen if e.type == "response.function_call_arguments.done")
        assert arguments.arguments == call.arguments and arguments.call_id == call.call_id
        assert done.response.status in WHOLE and not any("audio" in k for k in kinds)

        before, _ = _respond(
            conn, tool_choice="none", conversation="none", max_output_tokens=1
        )  # out of band
        conn.send_raw(json.dumps({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"sky": "clear"})}}))  # fmt: skip
        output = until(conn, "conversation.item.added", seen)
        assert output.item.type == "function_call_output" and output.item.call_id == call.call_id
        answer, seen = _respond(conn, tool_choice="none")
        (message,) = answer.response.output
        assert message.type == "message" and message.content[0].text
        # the call's output is in the prompt (the call itself already was)
        assert answer.response.usage.input_tokens > before.response.usage.input_tokens + 3
    finally:
        conn.close()
