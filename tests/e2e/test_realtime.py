"""The official OpenAI SDK's realtime client holds a session against /v1/realtime on the tiny
deployment: audio in, audio deltas and transcript out, cancel, truncate; bad events get an `error`
event and the session goes on."""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest
import websockets

PCM_RATE = 24000


def _speech(seconds: float, freq: float = 180.0) -> str:
    t = np.arange(int(seconds * PCM_RATE)) / PCM_RATE
    return base64.b64encode((np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()).decode()


def _until(conn, kind: str, seen: list) -> object:
    for event in conn:
        seen.append(event)
        if event.type == kind:
            return event
    raise AssertionError(f"connection closed before {kind}")


def test_sdk_session_audio_in_audio_and_transcript_out(openai_client, model_name):
    with openai_client.realtime.connect(model=model_name) as conn:
        seen: list = []
        assert _until(conn, "session.created", seen).session.model == model_name
        conn.session.update(
            session={"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 24}
        )
        _until(conn, "session.updated", seen)
        conn.input_audio_buffer.append(audio=_speech(0.6))
        conn.input_audio_buffer.commit()
        committed = _until(conn, "input_audio_buffer.committed", seen)
        conn.response.create()
        done = _until(conn, "response.done", seen)
        kinds = [e.type for e in seen]
        audio = [e for e in seen if e.type == "response.output_audio.delta"]
        words = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
        assert done.response.status == "completed"
        assert audio and all(base64.b64decode(e.delta) for e in audio)
        assert words and done.response.output[0].content[0].transcript == words
        assert (
            kinds.index("response.created")
            < kinds.index("response.output_audio.delta")
            < kinds.index("response.done")
        )
        assert committed.item_id

        # A second turn sees the first: the session's conversation is its messages.
        seen.clear()
        conn.input_audio_buffer.append(audio=_speech(0.4, 300.0))
        conn.input_audio_buffer.commit()
        conn.response.create()
        assert (
            _until(conn, "response.done", seen).response.usage.input_tokens > done.response.usage.input_tokens
        )


def test_cancel_and_truncate(openai_client, model_name):
    with openai_client.realtime.connect(model=model_name) as conn:
        seen: list = []
        _until(conn, "session.created", seen)
        conn.session.update(session={"type": "realtime", "max_output_tokens": 400})
        conn.input_audio_buffer.append(audio=_speech(0.5))
        conn.input_audio_buffer.commit()
        conn.response.create()
        first = _until(conn, "response.output_audio.delta", seen)
        # The client reports what it played (omniray's extension event): the session monitor's input.
        conn.send_raw(
            json.dumps({"type": "omniray.playback.progress", "item_id": first.item_id, "played_ms": 1})
        )
        conn.response.cancel()
        done = _until(conn, "response.done", seen)
        assert done.response.status == "cancelled"
        assert not [e for e in seen if e.type == "error"]
        conn.conversation.item.truncate(item_id=first.item_id, content_index=0, audio_end_ms=0)
        truncated = _until(conn, "conversation.item.truncated", seen)
        assert truncated.item_id == first.item_id and truncated.audio_end_ms == 0


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ("not json", "invalid_json"),
        (json.dumps({"type": "no.such.event"}), "unknown_event"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}), "invalid_event"),
        (json.dumps({"type": "input_audio_buffer.append"}), "invalid_event"),
        (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty"),
        (json.dumps({"type": "response.create"}), "invalid_event"),
        (
            json.dumps({"type": "conversation.item.truncate", "item_id": "x", "audio_end_ms": -1}),
            "invalid_event",
        ),
        (
            json.dumps({"type": "omniray.playback.progress", "item_id": "nope", "played_ms": 5}),
            "item_not_found",
        ),
    ],
)
def test_bad_events_get_an_error_and_the_session_goes_on(openai_client, model_name, event, code):
    with openai_client.realtime.connect(model=model_name) as conn:
        seen: list = []
        _until(conn, "session.created", seen)
        conn.send_raw(event)  # as is: the SDK would refuse to build most of these
        error = _until(conn, "error", seen)
        assert error.error.code == code, error
        conn.session.update(session={"type": "realtime"})
        _until(conn, "session.updated", seen)  # still answering


def test_unknown_key_and_model_are_refused(omniray, model_name):
    from openai import OpenAI

    bad = OpenAI(base_url=f"{omniray.http_url}/v1", api_key="sk-nobody", max_retries=0)
    with bad.realtime.connect(model=model_name) as conn:
        event = next(iter(conn))
        assert event.type == "error" and event.error.type == "authentication_error"


def test_sessions_over_the_admission_limit_are_refused_cleanly(model_name, omniray):
    """tiny admits 4 realtime sessions at once (configs/tiny.yaml); the next one gets an error event
    and close code 1013, and a place frees when a session ends."""
    import websockets.sync.client as ws_client

    from services.quota import LOCAL_API_KEY

    url = f"{omniray.http_url.replace('http', 'ws', 1)}/v1/realtime?model={model_name}"
    headers = {"Authorization": f"Bearer {LOCAL_API_KEY}"}

    def open_session():
        conn = ws_client.connect(url, additional_headers=headers)
        first = json.loads(conn.recv(timeout=30))
        return conn, first

    held, refused = [], None
    try:
        for _ in range(8):  # sessions of earlier tests may still be closing: count, do not assume
            conn, first = open_session()
            if first["type"] == "session.created":
                held.append(conn)
                continue
            refused = (conn, first)
            break
        assert refused is not None and 1 <= len(held) <= 4
        conn, first = refused
        assert first["type"] == "error" and first["error"]["code"] == "session_limit_reached"
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            conn.recv(timeout=30)
        assert closed.value.rcvd.code == 1013
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:  # the gateway notices the close and frees the place
            conn, first = open_session()
            if first["type"] == "session.created" or time.monotonic() > deadline:
                break
            conn.close()
            time.sleep(0.2)
        assert first["type"] == "session.created"
        held.append(conn)
    finally:
        for conn in held:
            conn.close()
