"""Locust users for omniray (`make loadtest`, or `locust -f loadtest/locustfiles/locustfile.py --host URL`).

Users: text chat and spoken answers (REST, streaming SSE), image chat (a data: URL PNG or JPEG),
documents (10-50 images: the router makes them a document), a realtime voice session with barge-in
(WebSocket `/v1/realtime`: espeak-ng speech at real-time pace, server VAD, playback reported with
`omniray.playback.progress`, interruptions by speaking over the reply or by response.cancel +
conversation.item.truncate), a realtime voice call over WebRTC (the browser's flow through
loadtest/clients/webrtc_client.py: Opus on RTP both ways, events on the data channel, server VAD) and gRPC
chat (`omni.v1.Omni/Chat`, server streaming). Each user class draws its API key from a mix of
tenants (configs/tenants/loadtest.yaml).

Every request is timed to its end and reported by hand, so a stream counts once it has ended; time
to first token and first audio go in as their own rows (type TTFT / TTFP) of Locust's stats and
CSVs. An answer without tokens (or, when audio was asked for, without audio), an `error` event, a
non-200 status or a gRPC error is a failure. Settings: environment variables, see docs/loadtest.md.

Only light modules are imported here (no Ray, no vLLM): Locust monkey-patches with gevent first.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import os
import random
import time

import grpc
import grpc.experimental.gevent as grpc_gevent
import numpy as np
import requests
import websockets
from locust import User, between, constant, task
from locust.exception import StopUser
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc
from PIL import Image

from loadtest.clients import voice_turns
from loadtest.clients.client import Result
from loadtest.clients.realtime_client import RealtimeClient
from loadtest.clients.speech import RATE, SENTENCES, speech
from loadtest.clients.webrtc_client import CallRefused, WebRtcClient
from loadtest.clients.workload import chat_prompts
from services.realtime.server_events import WHOLE

grpc_gevent.init_gevent()  # gRPC's own threads would block gevent's loop

MODEL = os.environ.get("LOADTEST_MODEL", "omniray-tiny")
GRPC_TARGET = os.environ.get("LOADTEST_GRPC_TARGET", "127.0.0.1:9000")
MAX_TOKENS = int(os.environ.get("LOADTEST_MAX_TOKENS", "32"))
BARGE_P = float(os.environ.get("LOADTEST_BARGE_P", "0.5"))
TIMEOUT_S = float(os.environ.get("LOADTEST_TIMEOUT_S", "120"))

# Tenant mix (keys of configs/tenants/loadtest.yaml), per user class.
KEYS = {
    "chat": ["sk-lt-acme-1", "sk-lt-acme-2", "sk-lt-globex"],
    "image": ["sk-lt-acme-1", "sk-lt-acme-2"],
    "document": ["sk-lt-initech-docs"],
    "voice": ["sk-lt-voicely"],
    "webrtc": ["sk-lt-voicely"],
    "grpc": ["sk-lt-globex", "sk-lt-acme-2"],
}
PROMPTS = chat_prompts(64, seed=8, max_tokens=MAX_TOKENS, median_words=30)


def _image(seed: int, fmt: str, size: tuple[int, int]) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt)
    return buf.getvalue()


IMAGES = [(_image(i, fmt, (64 + 32 * i, 48 + 16 * i)), fmt) for i, fmt in enumerate(["PNG", "JPEG"] * 4)]


def _data_url(data: bytes, fmt: str) -> str:
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(data).decode()}"


def fire(user: User, kind: str, name: str, seconds: float | None, error: str = "", length: int = 0) -> None:
    """One row entry in Locust's stats (milliseconds; a failure when `error` is set)."""
    user.environment.events.request.fire(
        request_type=kind,
        name=name,
        response_time=(seconds or 0.0) * 1000,
        response_length=length,
        exception=RuntimeError(error) if error else None,
        context={"tenant_key": getattr(user, "key", "")},
    )


class TenantUser(User):
    abstract = True
    kind = "chat"
    _counters: dict[str, itertools.count] = {}

    def on_start(self) -> None:
        n = next(self._counters.setdefault(self.kind, itertools.count()))
        keys = KEYS[self.kind]
        self.key = keys[n % len(keys)]
        self.rng = random.Random(f"{self.kind}-{n}")


class RestUser(TenantUser):
    abstract = True

    def on_start(self) -> None:
        super().on_start()
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {self.key}"

    def chat(self, name: str, content, audio: bool = False) -> None:
        prompt = self.rng.choice(PROMPTS)
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content(prompt.text)}],
            "max_tokens": prompt.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if audio:
            body.update(modalities=["text", "audio"], audio={"voice": "default", "format": "pcm16"})
        res, t0 = Result(ok=False), time.perf_counter()
        try:
            with self.http.post(
                f"{self.host}/v1/chat/completions", json=body, stream=True, timeout=TIMEOUT_S
            ) as r:
                if r.status_code != 200:
                    res.error = f"HTTP {r.status_code}: {r.text[:200]}"
                else:
                    for line in r.iter_lines(decode_unicode=True):
                        if line.startswith("data: {"):
                            res.add(json.loads(line[6:]), time.perf_counter() - t0)
                    res.error = _missing(res.ttft, res.ttfp if audio else 0.0)
        except (requests.RequestException, json.JSONDecodeError) as e:
            res.error = repr(e)
        res.e2e = time.perf_counter() - t0
        fire(self, "REST", name, res.e2e, res.error, res.completion_tokens)
        if not res.error:
            fire(self, "TTFT", name, res.ttft)
            if audio:
                fire(self, "TTFP", name, res.ttfp)


def _missing(ttft: float | None, ttfp: float | None) -> str:
    if ttft is None:
        return "the answer had no text"
    return "the answer had no audio" if ttfp is None else ""


class TextChatUser(RestUser):
    """Chat over REST; one request in three asks for a spoken answer too."""

    weight = 3
    wait_time = between(1, 3)

    @task(2)
    def text(self) -> None:
        self.chat("chat.text", lambda text: text)

    @task(1)
    def spoken(self) -> None:
        self.chat("chat.speech", lambda text: text, audio=True)


class ImageChatUser(RestUser):
    weight = 2
    kind = "image"
    wait_time = between(1, 3)

    @task
    def image(self) -> None:
        data, fmt = self.rng.choice(IMAGES)
        self.chat("chat.image", lambda text: [
            {"type": "text", "text": f"Describe this picture. {text}"},
            {"type": "image_url", "image_url": {"url": _data_url(data, fmt), "detail": "auto"}},
        ])  # fmt: skip


class DocumentUser(RestUser):
    """10-50 page images in one request (a document to the router: pages budget, batch class)."""

    fixed_count = 1
    kind = "document"
    wait_time = between(3, 6)

    @task
    def document(self) -> None:
        pages = [self.rng.choice(IMAGES) for _ in range(self.rng.randint(10, 50))]
        parts = [
            {"type": "image_url", "image_url": {"url": _data_url(d, f), "detail": "low"}} for d, f in pages
        ]
        self.chat("chat.document", lambda text: [{"type": "text", "text": f"Summarise. {text}"}, *parts])


class GrpcChatUser(TenantUser):
    """`omni.v1.Omni/Chat` over Serve's gRPC proxy; every other request with a picture and speech out."""

    weight = 2
    kind = "grpc"
    wait_time = between(1, 3)

    def on_start(self) -> None:
        super().on_start()
        self.channel = grpc.insecure_channel(GRPC_TARGET)
        self.stub = omni_pb2_grpc.OmniStub(self.channel)
        self.turn = 0

    def on_stop(self) -> None:
        self.channel.close()

    @task
    def chat(self) -> None:
        prompt = self.rng.choice(PROMPTS)
        parts = [omni_pb2.ContentPart(text=prompt.text)]
        audio = self.turn % 2 == 1
        self.turn += 1
        if audio:
            data, _ = self.rng.choice(IMAGES)
            parts.append(omni_pb2.ContentPart(image=omni_pb2.ImagePart(data=data, detail="auto")))
        req = omni_pb2.ChatRequest(
            model=MODEL,
            messages=[omni_pb2.Message(role="user", content=parts)],
            modalities=["text", "audio"] if audio else ["text"],
            sampling=common_pb2.SamplingParams(max_tokens=prompt.max_tokens),
        )
        name = "Omni/Chat+audio" if audio else "Omni/Chat"
        ttft = ttfp = None
        tokens, error, t0 = 0, "", time.perf_counter()
        try:
            for chunk in self.stub.Chat(
                req, metadata=[("authorization", f"Bearer {self.key}")], timeout=TIMEOUT_S
            ):
                now = time.perf_counter() - t0
                kind = chunk.WhichOneof("delta")
                if kind == "text" and ttft is None:
                    ttft = now
                elif kind == "audio" and ttfp is None:
                    ttfp = now
                if chunk.HasField("usage"):
                    tokens = chunk.usage.completion_tokens
            error = _missing(ttft, ttfp if audio else 0.0)
        except grpc.RpcError as e:
            error = f"{e.code().name}: {e.details()}"
        fire(self, "gRPC", name, time.perf_counter() - t0, error, tokens)
        if not error:
            fire(self, "TTFT", name, ttft)
            if audio:
                fire(self, "TTFP", name, ttfp)


class VoiceSession(RealtimeClient):
    """The shared realtime client (loadtest/clients/realtime_client.py) with a listener's playback."""

    def __init__(self, url: str, key: str) -> None:
        self.audio_ms: dict[str, float] = {}  # received per response
        super().__init__(url, key, on_event=self._count_audio, timeout=TIMEOUT_S)

    def _count_audio(self, event: dict) -> None:
        if event["type"] == "response.output_audio.delta":
            ms = len(base64.b64decode(event["delta"])) / 2 / RATE * 1000
            self.audio_ms[event["response_id"]] = self.audio_ms.get(event["response_id"], 0.0) + ms

    def done(self, response_id: str) -> bool:
        return self.find(lambda e: _is("response.done")(e) and e["response"]["id"] == response_id) is not None

    def speak(self, pcm: bytes) -> float:
        """Appends speech then 0.7 s of silence at real-time pace; returns when speech began."""
        return self.say(pcm + bytes(RATE * 2 * 7 // 10))[0]

    def play(self, item_id: str, response_id: str, stop_at_ms: float | None) -> tuple[float, float]:
        """Plays the response at real time from now, reporting progress, until `stop_at_ms` or its
        end; returns (played, received) ms."""
        played, last = 0.0, time.monotonic()
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            with self.cond:
                received = self.audio_ms.get(response_id, 0.0)
            played, last = min(played + (now - last) * 1000, received), now
            self.send({"type": "omniray.playback.progress", "item_id": item_id, "played_ms": played})
            if stop_at_ms is not None and played >= stop_at_ms:
                return played, received
            if played >= received and self.done(response_id):
                return played, received


def _is(kind: str):
    return lambda e: e["type"] == kind


class VoiceUser(TenantUser):
    """One realtime session per user: speak, hear the first audio, then listen to the end,
    talk over the reply (server VAD barge-in) or cancel and truncate it (client barge-in)."""

    fixed_count = 2
    kind = "voice"
    wait_time = constant(0.3)
    _speech: list[bytes] = []

    def on_start(self) -> None:
        super().on_start()
        if not VoiceUser._speech:
            VoiceUser._speech = [speech(s) for s in SENTENCES]
        url = f"{self.host.replace('http', 'ws', 1)}/v1/realtime?model={MODEL}"
        t0 = time.perf_counter()
        try:
            self.session = VoiceSession(url, self.key)
            created = self.session.wait(_is("session.created"), 0, what="session.created")
            self.session.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": MAX_TOKENS,
                               "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}})  # fmt: skip
            self.session.wait(_is("session.updated"), created, what="session.updated")
        except (TimeoutError, websockets.exceptions.WebSocketException, OSError) as e:
            fire(self, "WS", "realtime.connect", time.perf_counter() - t0, repr(e))
            raise StopUser() from e
        fire(self, "WS", "realtime.connect", time.perf_counter() - t0)
        self.pending: tuple[str, str, float] | None = None  # a reply talked over: (response, item, ms played)

    def on_stop(self) -> None:
        self.session.close()

    @task
    def turn(self) -> None:
        s, mark = self.session, len(self.session.events)
        try:
            spoke = s.speak(self.rng.choice(self._speech))
            if self.pending is not None:
                self._check_barge_in(mark, spoke)
            stopped = s.wait(_is("input_audio_buffer.speech_stopped"), mark, what="speech_stopped")
            created = s.wait(_is("response.created"), stopped, what="response.created")
            rid = s.events[created][1]["response"]["id"]
            first = s.wait(lambda e: e["type"] == "response.output_audio.delta" and e["response_id"] == rid,
                           created, what="audio delta")  # fmt: skip
            t_stop = s.events[stopped][0]
            fire(self, "TTFP", "realtime.turn", s.events[first][0] - t_stop)
            item = s.events[first][1]["item_id"]
            planned = voice_turns.plan(self.rng, BARGE_P)
            played, received = s.play(item, rid, self.rng.uniform(300, 1000) if planned else None)
            how = voice_turns.decide(planned, received - played, s.done(rid))
            if how is None:
                self._answered(rid, t_stop)
            else:
                self._interrupt(how, rid, item, played)
            # a cancel that crossed the reply's end on the wire is answered response_cancel_not_active
            errors = [
                f"{e['error'].get('code')}: {e['error']['message']}"
                for _, e in s.events[mark:]
                if e["type"] == "error" and e["error"].get("code") != "response_cancel_not_active"
            ] + [f"malformed event {m}" for m in s.malformed]
            s.malformed.clear()
            if errors:
                raise RuntimeError(f"error events: {errors[:3]}")
        except (TimeoutError, RuntimeError, websockets.exceptions.WebSocketException, OSError) as e:
            fire(self, "WS", "realtime.turn", 0, repr(e))
            self.pending = None

    def _answered(self, rid: str, t_stop: float) -> None:
        s = self.session
        done = s.wait(
            lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 0, what="response.done"
        )
        status = s.events[done][1]["response"]["status"]
        fire(self, "WS", "realtime.turn", s.events[done][0] - t_stop, "" if status in WHOLE else status)

    def _interrupt(self, how: str, rid: str, item: str, played: float) -> None:
        s = self.session
        if how == "speech":  # the next turn's speech is the barge-in
            self.pending = (rid, item, played)
            return
        mark, t0 = len(s.events), time.monotonic()
        if not s.done(rid):  # a reply already generated is only cut (its audio may still play)
            s.send({"type": "response.cancel"})
        s.send({"type": "conversation.item.truncate", "item_id": item, "content_index": 0,
                "audio_end_ms": int(played)})  # fmt: skip
        cut = s.wait(
            lambda e: e["type"] == "conversation.item.truncated" and e["item_id"] == item,
            mark,
            what="truncated",
        )
        s.wait(lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 0, what="response.done")
        fire(self, "WS", "realtime.cancel", s.events[cut][0] - t0)

    def _check_barge_in(self, mark: int, spoke: float) -> None:
        """Speech over the reply: the reply stops (no audio delta of it after speech_started) and
        its item is cut; timed from the first word to `conversation.item.truncated`."""
        s, (rid, item, _) = self.session, self.pending
        self.pending = None
        started = s.wait(_is("input_audio_buffer.speech_started"), mark, what="speech_started (barge-in)")
        cut = s.wait(lambda e: e["type"] == "conversation.item.truncated" and e["item_id"] == item, mark,
                     what="truncated (barge-in)")  # fmt: skip
        late = s.find(
            lambda e: e["type"] == "response.output_audio.delta" and e["response_id"] == rid, started
        )
        error = "audio of the interrupted reply after speech_started" if late is not None else ""
        fire(self, "WS", "realtime.barge_in", s.events[cut][0] - spoke, error)


class WebRtcVoiceUser(TenantUser):
    """One realtime call over WebRTC per user, as a browser holds one: speak a sentence into the
    microphone track, server VAD ends the turn, hear the answer on the remote track to its end.
    TTFP is from the end of speech (`speech_stopped`, on the data channel) to the first frame with
    sound; no barge-in here (the WebSocket voice user measures it)."""

    fixed_count = 1
    kind = "webrtc"
    wait_time = constant(0.3)

    def on_start(self) -> None:
        super().on_start()
        if not VoiceUser._speech:
            VoiceUser._speech = [speech(s) for s in SENTENCES]
        session = {"type": "realtime", "max_output_tokens": MAX_TOKENS,
                   "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}  # fmt: skip
        t0 = time.perf_counter()
        try:
            self.call = WebRtcClient(self.host, self.key, MODEL, timeout=TIMEOUT_S, session=session)
            self.call.wait(_is("session.created"), 0, what="session.created")
        except (CallRefused, TimeoutError, OSError) as e:
            fire(self, "WebRTC", "webrtc.connect", time.perf_counter() - t0, repr(e))
            raise StopUser() from e
        fire(self, "WebRTC", "webrtc.connect", time.perf_counter() - t0)

    def on_stop(self) -> None:
        self.call.close()

    @task
    def turn(self) -> None:
        c, mark = self.call, len(self.call.events)
        try:
            c.say(self.rng.choice(VoiceUser._speech) + bytes(RATE * 2 * 7 // 10))
            stopped = c.wait(_is("input_audio_buffer.speech_stopped"), mark, what="speech_stopped")
            t_stop = c.events[stopped][0]
            created = c.wait(_is("response.created"), stopped, what="response.created")
            rid = c.events[created][1]["response"]["id"]
            fire(self, "TTFP", "webrtc.turn", c.wait_sound(t_stop) - t_stop)
            done = c.wait(lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, created,
                          what="response.done")  # fmt: skip
            status = c.events[done][1]["response"]["status"]
            errors = [f"{e['error'].get('code')}: {e['error']['message']}" for _, e in c.events[mark:]
                      if e["type"] == "error"]  # fmt: skip
            error = f"error events: {errors[:3]}" if errors else ("" if status in WHOLE else status)
            fire(self, "WebRTC", "webrtc.turn", c.events[done][0] - t_stop, error)
        except (TimeoutError, OSError) as e:
            fire(self, "WebRTC", "webrtc.turn", 0, repr(e))
