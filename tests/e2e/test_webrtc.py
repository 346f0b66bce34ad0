"""Realtime over WebRTC on the tiny deployment, with an aiortc client (no browser): a spoken question
answered with audio on the RTP track, a barge-in that cuts the reply where the transport's playout
was; client secrets (single use, over WebRTC and a browser's WebSocket subprotocol); a call opened
with session settings through the OpenAI SDK (OpenAI's form); bad offers, forms and mint requests
answered with clear 4xx errors."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import httpx
import pytest
import websockets
import websockets.sync.client as ws_client

from loadtest.clients.realtime_client import RATE
from loadtest.clients.speech import speech
from loadtest.clients.webrtc_client import CallRefused, WebRtcClient
from services.models.profile import load_profile
from services.quota import LOCAL_API_KEY
from services.quota.tenants import RealtimeLimits
from services.realtime.server_events import WHOLE
from tests.conftest import AUTH, new_tenant

SILENCE = bytes(RATE * 2 * 8 // 10)
VAD = {"type": "server_vad", "silence_duration_ms": 400}


def _mint(omniray, body: dict, key: str = LOCAL_API_KEY) -> httpx.Response:
    return httpx.post(f"{omniray.http_url}/v1/realtime/client_secrets", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip


def _call(omniray, model_name, max_output_tokens: int, turn_detection: dict | None) -> WebRtcClient:
    """A call whose session has these settings."""
    c = WebRtcClient(omniray.http_url, model=model_name, timeout=90)
    c.wait("session.created")
    c.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": max_output_tokens,
                                                  "audio": {"input": {"turn_detection": turn_detection}}}})  # fmt: skip
    c.wait("session.updated")
    return c


def _assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and "Traceback" not in error["message"], error
    return error


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng to speak")
def test_a_spoken_question_is_answered_over_rtp_and_a_barge_in_cuts_it(omniray, model_name):
    c = _call(omniray, model_name, max_output_tokens=400, turn_detection=VAD)
    try:
        asked = time.monotonic()
        c.say(speech("What is the weather like in Paris today?") + SILENCE)
        committed = c.wait("input_audio_buffer.committed", c.wait("input_audio_buffer.speech_stopped"))
        created = c.wait("response.created", committed)
        started = c.wait("output_audio_buffer.started", created)
        response_id = c.event(created)["response"]["id"]
        assert c.event(started)["response_id"] == response_id
        heard = c.wait_sound(c.at(created))
        assert c.sound_after(asked) == heard  # silence until the answer
        time.sleep(1.0)  # let a second of the answer play

        c.say(speech("Wait, stop, tell me about London instead.")[: RATE * 2])  # still talking
        barge = c.wait("input_audio_buffer.speech_started", started)
        # The next turn's answer short: it plays out in real time before it is done.
        c.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 24}})
        done = c.wait("response.done", barge)
        truncated = c.event(c.wait("conversation.item.truncated", barge))
        cleared = c.wait("output_audio_buffer.cleared", barge)
        assert c.event(done)["response"]["status"] == "cancelled"
        assert c.event(cleared)["response_id"] == response_id
        # Cut where the transport's playout was: what the server sent of it by the barge-in, however
        # fast or slow the answer was generated (send times: this client's own lag does not count).
        sent_ms = 20 * len(c.sound_sent(before=c.at(barge)))
        assert sent_ms - 100 <= truncated["audio_end_ms"] <= sent_ms + 400, (truncated, sent_ms)
        assert truncated["omniray"]["wasted_tokens"] > 0
        # The microphone's silence ends the interruption: it is the next turn, answered. Until that
        # answer plays, nothing of the cut reply does (frames in flight aside).
        created2 = c.wait("response.created", done)
        started2 = c.wait("output_audio_buffer.started", created2)
        assert c.sound_sent(c.at(cleared) + 0.2, c.at(started2) - 0.1) == []
        second = c.wait("response.done", created2)
        assert c.event(second)["response"]["status"] in WHOLE
        # Audio travels on the track only; the data channel carries the events.
        assert not [e for _, e in c.events if e["type"] == "response.output_audio.delta"]
        assert c.errors() == [] and c.malformed == []
    finally:
        c.close()


def test_a_call_is_hung_up_and_the_session_closed(omniray, model_name):
    c = WebRtcClient(omniray.http_url, model=model_name, timeout=60)
    try:
        c.wait("session.created")
        other = httpx.post(f"{c.call_url}-x/hangup", headers=AUTH, timeout=10)
        _assert_error(other, 404, "call_not_found")
        assert httpx.post(f"{c.call_url}/hangup", headers=AUTH, timeout=10).status_code == 200
        c.wait_closed(timeout=15)  # the data channel closes with the call
    finally:
        c.close()


def test_a_call_whose_microphone_stops_is_told_and_ended_when_idle(omniray, model_name):
    """A peer that sends no audio frame and no event (its microphone track ended, the page frozen)
    for the profile's `realtime.idle_timeout_s`: an `error` `session_idle_timeout`, then the call ends."""
    idle_s = load_profile("tiny").realtime.idle_timeout_s
    c = WebRtcClient(omniray.http_url, model=model_name, timeout=60)
    try:
        c.wait("session.created")
        c.loop.call_soon_threadsafe(c.mic.stop)  # no more RTP from the client
        stopped = time.monotonic()
        told = c.event(c.wait("error", timeout=idle_s + 30))["error"]
        assert told["code"] == "session_idle_timeout", told
        assert idle_s - 1 <= time.monotonic() - stopped <= idle_s + 15
        c.wait_closed(timeout=15)
    finally:
        c.close()


def test_a_client_secret_opens_one_session_over_webrtc(omniray, model_name):
    minted = _mint(omniray, {"expires_after": {"anchor": "created_at", "seconds": 60},
                             "session": {"type": "realtime", "instructions": "Answer in French.",
                                         "audio": {"output": {"voice": "marin"}}}})  # fmt: skip
    assert minted.status_code == 200, minted.text
    secret = minted.json()
    assert secret["value"].startswith("ek_") and secret["expires_at"] > time.time() + 50
    assert (
        secret["session"]["model"] == model_name and secret["session"]["instructions"] == "Answer in French."
    )
    # A bad offer does not use it up.
    bad = httpx.post(f"{omniray.http_url}/v1/realtime/calls", content=b"v=0\r\nm=audio nonsense",
                     headers={"Authorization": f"Bearer {secret['value']}", "Content-Type": "application/sdp"})  # fmt: skip
    _assert_error(bad, 400, "invalid_sdp")
    c = WebRtcClient(omniray.http_url, api_key=secret["value"], timeout=60)
    try:
        session = c.event(c.wait("session.created"))["session"]
        assert session["instructions"] == "Answer in French."
        assert session["audio"]["output"]["voice"] == "marin"
    finally:
        c.close()
    with pytest.raises(CallRefused) as again:
        WebRtcClient(omniray.http_url, api_key=secret["value"], timeout=60)
    assert again.value.status == 401 and again.value.body["error"]["code"] == "invalid_client_secret"


def test_the_openai_sdk_opens_a_call_with_its_session_settings(omniray, model_name):
    """`client.realtime.calls.create(sdp=..., session=...)` (OpenAI's multipart form): the session
    starts with those settings, the model named in them, and answers within their token cap."""
    settings = {"type": "realtime", "model": model_name, "instructions": "Answer in French.", "max_output_tokens": 4,
                "audio": {"input": {"turn_detection": None}, "output": {"voice": "marin"}}}  # fmt: skip
    c = WebRtcClient(omniray.http_url, session=settings, timeout=60)
    try:
        session = c.event(c.wait("session.created"))["session"]
        assert session["instructions"] == "Answer in French." and session["max_output_tokens"] == 4
        assert (
            session["audio"]["output"]["voice"] == "marin"
            and session["audio"]["input"]["turn_detection"] is None
        )
        c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                             "content": [{"type": "input_text", "text": "Hello?"}]}})  # fmt: skip
        c.send({"type": "response.create"})
        done = c.event(c.wait("response.done"))["response"]
        assert done["status"] in WHOLE and done["usage"]["output_tokens"] <= 4, done
        assert c.errors() == []
    finally:
        c.close()


def test_bad_call_forms_are_refused(omniray):
    """Settings are checked before the session opens (422 naming the field); a form needs its
    offer; a client secret's settings were fixed when it was minted: a form that brings others is
    refused, and the secret is still good for a call."""
    offer = asyncio.run(_offer())

    def form(session: dict | None, key: str = LOCAL_API_KEY, sdp: str | None = offer) -> httpx.Response:
        files = {} if sdp is None else {"sdp": (None, sdp, "application/sdp")}
        if session is not None:
            files["session"] = (None, json.dumps(session), "application/json")
        return httpx.post(f"{omniray.http_url}/v1/realtime/calls", files=files,
                          headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip

    refused = _assert_error(form({"audio": {"output": {"voice": "nobody"}}}), 422, "invalid_value")
    assert refused["param"] == "session.audio.output.voice"
    _assert_error(form({"model": "gpt-unknown"}), 422, "model_not_found")
    _assert_error(form({}, sdp=None), 400, "invalid_request")
    secret = _mint(omniray, {}).json()["value"]
    _assert_error(form({"instructions": "Ignore the server."}, key=secret), 400, "invalid_request")
    c = WebRtcClient(omniray.http_url, api_key=secret, timeout=60)
    try:
        c.wait("session.created")
    finally:
        c.close()


def test_a_browser_websocket_authenticates_with_a_subprotocol(omniray, model_name):
    """`new WebSocket(url, ["realtime", "openai-insecure-api-key." + secret])`: accepted with the
    `realtime` subprotocol; the secret is single use; the API key works the same way."""
    url = f"{omniray.http_url.replace('http', 'ws', 1)}/v1/realtime?model={model_name}"
    secret = _mint(omniray, {}).json()["value"]
    for key, opens in ((secret, True), (secret, False), (LOCAL_API_KEY, True)):
        with ws_client.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{key}"]) as ws:
            assert ws.subprotocol == "realtime"
            first = ws.recv(timeout=30)
            if opens:
                assert '"session.created"' in first, first
            else:
                assert '"invalid_client_secret"' in first, first
                with pytest.raises(websockets.exceptions.ConnectionClosed):
                    ws.recv(timeout=10)
                assert ws.close_code == 1008


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"expires_after": {"anchor": "created_at", "seconds": 5}}, 422, "invalid_value"),
        ({"expires_after": {"anchor": "created_at", "seconds": 9000}}, 422, "invalid_value"),
        ({"expires_after": {"anchor": "used_at", "seconds": 60}}, 422, "invalid_value"),
        ({"session": {"audio": {"output": {"voice": "nobody"}}}}, 422, "invalid_value"),
        ({"session": {"model": "gpt-unknown"}}, 422, "model_not_found"),
        ({"session": {"max_output_tokens": 10**9}}, 422, "invalid_value"),
        ({"session": "not an object"}, 422, "invalid_value"),
        ({"unknown": 1}, 422, "invalid_value"),
    ],
)
def test_bad_client_secret_requests_are_refused(omniray, body, status, code):
    _assert_error(_mint(omniray, body), status, code)


def test_client_secrets_need_an_api_key(omniray):
    _assert_error(_mint(omniray, {}, key="sk-nobody"), 401, "invalid_api_key")
    secret = _mint(omniray, {}).json()["value"]
    _assert_error(_mint(omniray, {}, key=secret), 401, "invalid_api_key")  # a secret cannot mint more
    not_json = httpx.post(f"{omniray.http_url}/v1/realtime/client_secrets", content=b"{nope",
                          headers=AUTH, timeout=30)  # fmt: skip
    assert not_json.status_code == 400


def test_a_tenant_mints_at_most_its_cap_of_outstanding_secrets(omniray):
    key = new_tenant(omniray, realtime=RealtimeLimits(max_client_secrets=2))
    secret = _mint(omniray, {}, key=key).json()["value"]
    assert _mint(omniray, {}, key=key).status_code == 200
    full = _mint(omniray, {}, key=key)
    _assert_error(full, 429, "rate_limit_exceeded")
    assert 1 <= int(full.headers["retry-after"]) <= 600  # when the first expires (the default 600 s)
    c = WebRtcClient(omniray.http_url, api_key=secret, timeout=60)  # used: its place is free
    try:
        c.wait("session.created")
    finally:
        c.close()
    assert _mint(omniray, {}, key=key).status_code == 200


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"v=0\r\n", "text/plain", 415, "unsupported_media_type"),
        (b"\xff\xfe garbage", "application/sdp", 400, "invalid_sdp"),
        (b"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n", "application/sdp", 400, "invalid_sdp"),
        (
            b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" + b"a=x\r\n" * 20000,
            "application/sdp",
            413,
            "request_too_large",
        ),
        (
            b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\n",
            "application/sdp",
            400,
            "invalid_sdp",
        ),
    ],
)
def test_bad_offers_are_refused(omniray, body, content_type, status, code):
    answer = httpx.post(f"{omniray.http_url}/v1/realtime/calls", content=body,
                        headers={**AUTH, "Content-Type": content_type}, timeout=30)  # fmt: skip
    _assert_error(answer, status, code)


def test_a_refused_session_is_an_http_error_before_any_media(omniray, model_name):
    for key, model, status, code in (("sk-nobody", model_name, 401, "invalid_api_key"),
                                     (LOCAL_API_KEY, "gpt-unknown", 404, "model_not_found")):  # fmt: skip
        with pytest.raises(CallRefused) as refused:
            WebRtcClient(omniray.http_url, api_key=key, model=model, timeout=30)
        assert refused.value.status == status and refused.value.body["error"]["code"] == code


def test_the_clients_clear_cuts_the_answer_where_it_was_heard(omniray, model_name):
    """`output_audio_buffer.clear` while the answer plays (its text all written or not): one
    `output_audio_buffer.cleared`, the item cut to what was heard, and nothing more of it plays."""
    c = _call(omniray, model_name, max_output_tokens=200, turn_detection=None)
    try:
        c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                             "content": [{"type": "input_text", "text": "Tell me a story."}]}})  # fmt: skip
        c.send({"type": "response.create"})
        started = c.wait("output_audio_buffer.started")
        time.sleep(1.0)
        c.send({"type": "output_audio_buffer.clear"})
        cleared = c.wait("output_audio_buffer.cleared", started)
        truncated = c.event(c.wait("conversation.item.truncated", started))
        time.sleep(1.0)
        assert len([e for _, e in c.events if e["type"] == "output_audio_buffer.cleared"]) == 1
        sent_ms = 20 * len(c.sound_sent(before=c.at(cleared)))
        assert sent_ms - 100 <= truncated["audio_end_ms"] <= sent_ms + 400, (truncated, sent_ms)
        assert c.sound_sent(c.at(cleared) + 0.2) == []
        assert c.errors() == []
    finally:
        c.close()


async def _offer() -> str:
    """An offer from a peer that will never connect (its answer is never applied)."""
    from aiortc import RTCConfiguration, RTCPeerConnection
    from aiortc.mediastreams import AudioStreamTrack

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(AudioStreamTrack())
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def test_a_peer_that_never_connects_gives_its_session_back(omniray, model_name):
    """The call is answered, the peer never connects: after the connect deadline the session ends
    and the tenant's only session slot is free again."""
    key = new_tenant(omniray, realtime=RealtimeLimits(max_sessions=1))
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/sdp"}
    url = f"{omniray.http_url}/v1/realtime/calls?model={model_name}"
    assert httpx.post(url, content=asyncio.run(_offer()), headers=headers, timeout=30).status_code == 201
    held = httpx.post(url, content=asyncio.run(_offer()), headers=headers, timeout=30)
    _assert_error(held, 429, "session_limit_reached")  # the silent peer holds the slot
    connect_s = load_profile("tiny").realtime.webrtc_connect_timeout_s
    deadline = time.monotonic() + connect_s + 30
    while time.monotonic() < deadline:
        time.sleep(2)
        try:
            c = WebRtcClient(omniray.http_url, api_key=key, model=model_name, timeout=30)
        except CallRefused as refused:
            assert refused.status == 429
            continue
        c.wait("session.created")
        c.close()
        return
    raise AssertionError(f"the slot was not given back within {connect_s + 30:.0f} s")
