"""The official OpenAI SDK's realtime client holds a session against /v1/realtime on the tiny
deployment: audio in, audio deltas and transcript out, cancel, truncate; bad events get an `error`
event and the session goes on."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import time
import urllib.request

import numpy as np
import pytest

from loadtest.clients.realtime_client import RealtimeClient
from loadtest.clients.speech import speech
from services.realtime.server_events import WHOLE
from tests.conftest import until

PCM_RATE = 24000
# The client commits and asks for responses itself (server VAD is on by default, as OpenAI's).
MANUAL_TURNS = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


def _speech(seconds: float, freq: float = 180.0) -> str:
    t = np.arange(int(seconds * PCM_RATE)) / PCM_RATE
    return base64.b64encode((np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()).decode()


def test_sdk_session_audio_in_audio_and_transcript_out(openai_client, model_name):
    with openai_client.realtime.connect(model=model_name) as conn:
        seen: list = []
        assert until(conn, "session.created", seen).session.model == model_name
        conn.session.update(session={**MANUAL_TURNS, "output_modalities": ["audio"], "max_output_tokens": 24})
        until(conn, "session.updated", seen)
        conn.input_audio_buffer.append(audio=_speech(0.6))
        conn.input_audio_buffer.commit()
        committed = until(conn, "input_audio_buffer.committed", seen)
        conn.response.create()
        done = until(conn, "response.done", seen)
        kinds = [e.type for e in seen]
        audio = [e for e in seen if e.type == "response.output_audio.delta"]
        words = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
        assert done.response.status in WHOLE
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
            until(conn, "response.done", seen).response.usage.input_tokens > done.response.usage.input_tokens
        )


def test_cancel_and_truncate(openai_client, model_name):
    with openai_client.realtime.connect(model=model_name) as conn:
        seen: list = []
        until(conn, "session.created", seen)
        conn.session.update(session={**MANUAL_TURNS, "max_output_tokens": 400})
        conn.input_audio_buffer.append(audio=_speech(0.5))
        conn.input_audio_buffer.commit()
        conn.response.create()
        first = until(conn, "response.output_audio.delta", seen)
        # The client reports what it played (omniray's extension event): the session monitor's input.
        conn.send_raw(
            json.dumps({"type": "omniray.playback.progress", "item_id": first.item_id, "played_ms": 1})
        )
        conn.response.cancel()
        done = until(conn, "response.done", seen)
        assert done.response.status == "cancelled"
        assert not [e for e in seen if e.type == "error"]
        conn.conversation.item.truncate(item_id=first.item_id, content_index=0, audio_end_ms=0)
        truncated = until(conn, "conversation.item.truncated", seen)
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
        (  # refused when set, not at the next response
            json.dumps({"type": "session.update", "session": {"audio": {"output": {"voice": "zz"}}}}),
            "invalid_value",
        ),
    ],
)
def test_bad_events_get_an_error_and_the_session_goes_on(openai_client, model_name, event, code):
    with openai_client.realtime.connect(model=model_name) as conn:
        seen: list = []
        until(conn, "session.created", seen)
        conn.send_raw(event)  # as is: the SDK would refuse to build most of these
        error = until(conn, "error", seen)
        assert error.error.code == code, error
        conn.session.update(session={"type": "realtime"})
        until(conn, "session.updated", seen)  # still answering


def test_openai_model_and_voice_names_open_a_spoken_session(openai_client, model_name):
    """A client left at OpenAI's defaults (gpt-realtime, marin): the profile's aliases."""
    with openai_client.realtime.connect(model="gpt-realtime") as conn:
        seen: list = []
        assert until(conn, "session.created", seen).session.model == model_name
        voice = {"input": MANUAL_TURNS["audio"]["input"], "output": {"voice": "marin"}}
        conn.session.update(session={**MANUAL_TURNS, "audio": voice, "max_output_tokens": 8})
        assert until(conn, "session.updated", seen).session.audio.output.voice == "marin"
        conn.input_audio_buffer.append(audio=_speech(0.4))
        conn.input_audio_buffer.commit()
        conn.response.create()
        assert until(conn, "response.done", seen).response.status in WHOLE
        assert [e for e in seen if e.type == "response.output_audio.delta"]


def test_unknown_key_and_model_are_refused(omniray, model_name):
    from openai import OpenAI

    bad = OpenAI(base_url=f"{omniray.http_url}/v1", api_key="sk-nobody", max_retries=0)
    with bad.realtime.connect(model=model_name) as conn:
        event = next(iter(conn))
        assert event.type == "error" and event.error.type == "authentication_error"


def test_sessions_over_the_admission_limit_are_refused_cleanly(model_name, omniray):
    """tiny admits 4 realtime sessions at once (configs/tiny.yaml); the next one gets an error event
    and close code 1013, and a place frees when a session ends."""

    def open_session():
        client = RealtimeClient(_url(omniray, model_name))
        return client, client.event(client.wait(lambda e: True, timeout=30))

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
        with pytest.raises(TimeoutError, match="closed"):
            conn.wait("session.created", timeout=30)
        assert conn.close_code == 1013
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


def _url(omniray, model_name) -> str:
    return f"{omniray.http_url.replace('http', 'ws', 1)}/v1/realtime?model={model_name}"


@contextlib.contextmanager
def realtime(omniray, model_name):
    """A session with the shared realtime client; every event it got is one the server defines."""
    client = RealtimeClient(_url(omniray, model_name))
    try:
        yield client
    finally:
        client.close()
    assert not client.malformed, client.malformed


def _assert_scraped(omniray, wanted) -> None:
    """Each of `wanted` appears in the Prometheus scrape within a minute (Ray exports with a lag)."""
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(omniray.metrics_url, timeout=10) as resp:
            scrape = resp.read().decode()
        missing = [m for m in wanted if m not in scrape]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert not missing, missing


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng to speak")
def test_server_vad_turns_and_barge_in(omniray, model_name):
    """Speech then silence is a turn (speech_started/stopped, committed, a response); speech over
    the response stops it before any further audio delta, cuts the assistant's item to what was
    played and counts the rest as wasted; the next turn runs on the cut conversation."""
    question = speech("What is the weather like in Paris today?")
    interrupt = speech("Wait, stop, tell me about London instead.")
    silence = bytes(PCM_RATE * 2 * 8 // 10)
    with realtime(omniray, model_name) as r:
        r.wait("session.created")
        td = {"type": "server_vad", "silence_duration_ms": 400}
        r.send({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 400, "audio": {"input": {"turn_detection": td}}}})  # fmt: skip
        r.wait("session.updated")
        r.say(question + silence)
        started = r.wait("input_audio_buffer.speech_started")
        stopped = r.wait("input_audio_buffer.speech_stopped", started)
        committed = r.wait("input_audio_buffer.committed", stopped)
        assert r.event(committed)["item_id"] == r.event(started)["item_id"]
        first = r.wait("response.output_audio.delta", r.wait("response.created", committed))
        item_id = r.event(first)["item_id"]
        r.send({"type": "omniray.playback.progress", "item_id": item_id, "played_ms": 40})
        # The next turn (the interruption) short, so that it completes soon (generation is paced by
        # playback: the scheduler holds what is far ahead of it); the answer under way keeps its own.
        r.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 24}})

        sent = r.say(interrupt + silence)
        barge = r.wait("input_audio_buffer.speech_started", first)
        done = r.wait("response.done", first)
        truncated = r.wait("conversation.item.truncated", first)
        t_barge, barge_event = r.events[barge]
        after = [e for _, e in r.events[barge:] if e["type"] == "response.output_audio.delta"
                 and e["response_id"] == r.event(first)["response_id"]]  # fmt: skip
        assert after == []  # not one audio delta of the interrupted response after speech start
        assert r.event(done)["response"]["status"] == "cancelled"
        assert r.at(done) - t_barge < 0.1  # the response is over within 100 ms
        # Detection: speech begins at the window after the prefix padding; it was sent by then.
        onset_ms = barge_event["audio_start_ms"] + 300 - (len(question) + len(silence)) / 2 / PCM_RATE * 1000
        onset_chunk = min(max(int(onset_ms // 100), 0), len(sent) - 1)
        assert t_barge - sent[onset_chunk] < 0.5
        cut = r.event(truncated)
        assert cut["item_id"] == item_id and cut["audio_end_ms"] >= 40
        assert 0 < cut["omniray"]["wasted_tokens"] <= cut["omniray"]["generated_tokens"]

        # The next turn (the interruption) runs on the cut conversation.
        r.wait("input_audio_buffer.committed", truncated)
        second = r.wait("response.done", r.wait("response.created", truncated))
        assert r.event(second)["response"]["status"] in WHOLE
        r.send({"type": "conversation.item.retrieve", "item_id": item_id})
        kept = r.event(r.wait("conversation.item.retrieved", second))["item"]["content"][0]["transcript"]
        rid = r.event(first)["response_id"]
        generated = "".join(e["delta"] for _, e in r.events if e.get("response_id") == rid
                            and e["type"] == "response.output_audio_transcript.delta")  # fmt: skip
        assert generated.startswith(kept) and len(kept) < len(generated)
    # The decode engine ranked this session's requests from the board: its decision time and the
    # urgency classes reach Prometheus; the barge-in and the wasted tokens too.
    wanted = ("ray_omniray_scheduler_decision_seconds_count", "ray_omniray_scheduler_ranked_total",
              "ray_omniray_realtime_barge_ins_total", "ray_omniray_realtime_wasted_tokens_total")  # fmt: skip
    _assert_scraped(omniray, wanted)


def _spoken_turn_cache_hits(omniray, model_name, pcm: bytes, ahead: bool, words: list[str]) -> float:
    """One spoken turn after a long unique system prompt; the prefill replica's prefix-cache hits
    (tokens) while it ran, and the response's status."""
    from ray import serve

    prefill = serve.get_deployment_handle("Prefill", app_name="omniray")
    with realtime(omniray, model_name) as r:
        r.wait("session.created")
        session = {"type": "realtime", "max_output_tokens": 8, "instructions": " ".join(words),
                   "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}},
                   "omniray": {"speculative_prefill": ahead}}  # fmt: skip
        r.send({"type": "session.update", "session": session})
        r.wait("session.updated")
        before = prefill.prompt_token_sources.remote().result().get("local_cache_hit", 0)
        r.say(pcm + bytes(PCM_RATE * 2 * 6 // 10))
        done = r.wait("response.done", r.wait("input_audio_buffer.speech_stopped"), timeout=120)
        assert r.event(done)["response"]["status"] in WHOLE
        return prefill.prompt_token_sources.remote().result().get("local_cache_hit", 0) - before


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng to speak")
def test_turn_is_prefilled_while_spoken(omniray, ray_driver, model_name):
    """With speculative prefill (on in the tiny profile) the conversation and the first seconds of
    the turn are prefilled while the user speaks, so the turn's own prefill finds them cached; the
    same turn with it switched off for the session finds nothing of its new system prompt."""
    pcm = speech("Please tell me everything you know about the history of Paris.")
    assert len(pcm) / 2 / PCM_RATE > 2.5  # at least two whole 1 s chunks before the end
    prompt = [f"fact{i}" for i in range(300)]  # unique per session: no earlier test cached it
    off = _spoken_turn_cache_hits(omniray, model_name, pcm, False, ["off", *prompt])
    on = _spoken_turn_cache_hits(omniray, model_name, pcm, True, ["on", *prompt])
    assert off < 32, off  # not one page of the new prompt was there before the turn
    assert on >= 300, on  # the system prompt (and chunks) were prefilled ahead
    wanted = ("ray_omniray_realtime_prefill_ahead_total{", "ray_omniray_realtime_prefill_ahead_tokens_total")
    _assert_scraped(omniray, wanted)


def _png_data_url(size: int = 64) -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((size, size, 3)) * 255).astype("uint8")).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_an_image_joins_the_conversation(omniray, model_name):
    """A user item with an `input_image` part (a data: URL, OpenAI's shape) is read by the next
    response (its prompt grows by the image's tokens); a bad image is an `error` event and the
    session goes on."""
    with realtime(omniray, model_name) as r:
        r.wait("session.created")
        r.send({"type": "session.update", "session": {**MANUAL_TURNS, "output_modalities": ["text"],
                                                      "max_output_tokens": 4}})  # fmt: skip
        r.wait("session.updated")
        usage = []
        for content in ([{"type": "input_text", "text": "What is this?"}],
                        [{"type": "input_image", "image_url": _png_data_url()}]):  # fmt: skip
            at = r.mark()
            r.send(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": content},
                }
            )
            added = r.event(r.wait("conversation.item.added", at))
            assert [c["type"] for c in added["item"]["content"]] == [content[0]["type"]]
            r.send({"type": "response.create"})
            done = r.event(r.wait("response.done", at))
            assert done["response"]["status"] in WHOLE, done
            usage.append(done["response"]["usage"]["input_tokens"])
        assert usage[1] > usage[0] + 10  # the image's tokens are in the prompt
        for part, code in (({"type": "input_image", "image_url": "https://example.com/x.png"}, "invalid_image_url"),
                           ({"type": "input_image", "image_url": "data:image/png;base64,AAAA"}, "invalid_image"),
                           ({"type": "input_image"}, "invalid_value")):  # fmt: skip
            at = r.mark()
            r.send(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [part]},
                }
            )
            assert r.event(r.wait("error", at))["error"]["code"] == code
        at = r.mark()
        r.send({"type": "session.update", "session": {"type": "realtime"}})
        r.wait("session.updated", at)  # still answering


def _frame_url(value: int) -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (96, 64), (value, 255 - value, 128)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_camera_frames_shown_while_speaking_join_the_turn(omniray, model_name):
    """`input_image_buffer.append` frames (omniray's camera extension) sent during a turn: within the
    frame rate and unlike the last kept one, they are held and join the committed turn after its
    audio (its prompt grows by their tokens); a repeated frame, a frame over the rate and a bad one
    are not, the last with an `error` event."""
    with realtime(omniray, model_name) as r:
        r.wait("session.created")
        r.send({"type": "session.update", "session": {**MANUAL_TURNS, "output_modalities": ["text"],
                                                      "max_output_tokens": 4}})  # fmt: skip
        r.wait("session.updated")
        usage, frames = [], []
        for shown in ([], [0, 0, 200]):
            at = r.mark()
            for value in shown:
                r.send({"type": "input_image_buffer.append", "image_url": _frame_url(value)})
                time.sleep(0.6)  # tiny's camera takes 2 frames a second
            r.send({"type": "input_audio_buffer.append", "audio": _speech(0.5)})
            r.send({"type": "input_audio_buffer.commit"})
            item = r.event(r.wait("conversation.item.done", at))["item"]
            frames.append(sum(c["type"] == "input_image" for c in item["content"]))
            r.send({"type": "response.create"})
            done = r.event(r.wait("response.done", at))
            assert done["response"]["status"] in WHOLE, done
            usage.append(done["response"]["usage"]["input_tokens"])
        assert frames == [0, 2]  # the repeated frame is a near-duplicate
        assert usage[1] - usage[0] > 2 * 64  # tiny's ViT: 64 rows a frame
        at = r.mark()
        r.send({"type": "input_image_buffer.append", "image_url": "data:image/png;base64,AAAA"})
        assert r.event(r.wait("error", at))["error"]["code"] == "invalid_image"
        r.send({"type": "input_image_buffer.append", "image_url": _frame_url(50)})
        r.send({"type": "input_image_buffer.append", "image_url": _frame_url(90)})  # over the rate
        r.send({"type": "input_audio_buffer.append", "audio": _speech(0.5)})
        r.send({"type": "input_audio_buffer.commit"})
        item = r.event(r.wait("conversation.item.done", at))["item"]
        assert sum(c["type"] == "input_image" for c in item["content"]) == 1
