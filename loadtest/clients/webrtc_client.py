"""An OpenAI-Realtime client over WebRTC (aiortc), for tests and benchmarks: the browser's flow
without a browser. It POSTs its SDP offer to /v1/realtime/calls, speaks into its microphone track
at real-time pace, keeps the server events from the `oai-events` data channel (the same event log
as the WebSocket client's) and the audio it hears on the remote track, with arrival times.

aiortc runs on an event loop of the client's own thread; the methods here block, like the
WebSocket client's."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import av
import httpx
import numpy as np
import openai
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from loadtest.clients.realtime_client import RATE, ServerEventLog
from services.gateway.realtime.pacing import FramePacer
from services.quota import LOCAL_API_KEY

FRAME = RATE // 50  # 20 ms
HEARD_LEVEL = 1  # a received frame with any sample beyond this is sound, not silence


class CallRefused(Exception):
    """The server answered the offer with an error (status, OpenAI-style body)."""

    def __init__(self, status: int, body: dict):
        super().__init__(status, body)
        self.status, self.body = status, body


def _sdk_call(http_url: str, api_key: str, model: str | None, offer: str, session: dict, timeout: float):
    """The OpenAI SDK's call creation (its HTTP response, errors included)."""
    client = openai.OpenAI(base_url=f"{http_url}/v1", api_key=api_key, timeout=timeout, max_retries=0)
    try:
        raw = client.realtime.calls.with_raw_response.create(
            sdp=offer, session=session, extra_query={"model": model} if model else None
        )
    except openai.APIStatusError as e:
        return e.response
    finally:
        client.close()
    return raw.http_response


class Microphone(MediaStreamTrack):
    """pcm16 at 24 kHz fed by `feed`, sent at real time in 20 ms frames; silence when none."""

    kind = "audio"

    def __init__(self):
        super().__init__()
        self.pending = bytearray()
        self._pacer = FramePacer(RATE)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._pacer.wait()
        pcm = bytes(self.pending[: FRAME * 2])
        del self.pending[: FRAME * 2]
        return self._pacer.frame(pcm)


class WebRtcClient(ServerEventLog):
    def __init__(
        self,
        http_url: str,
        api_key: str = LOCAL_API_KEY,
        model: str | None = None,
        on_event: Callable[[dict], None] | None = None,
        timeout: float = 120,
        session: dict | None = None,
    ):
        """`http_url`: the gateway (http://host:port). `session`: settings to open the session with,
        sent as an application does, through the OpenAI SDK (`realtime.calls.create`: OpenAI's
        multipart form); without them the offer is the body, as a browser sends it. Raises
        CallRefused when the offer is refused."""
        super().__init__(on_event, timeout)
        self.heard: list[tuple[float, int, float]] = []  # (arrival, peak |sample|, media time) per frame
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.mic = Microphone()
        self.call_url: str | None = None
        try:
            offer = self._run(self._offer())
            if session is None:
                answer = httpx.post(
                    f"{http_url}/v1/realtime/calls",
                    params={"model": model} if model else None,
                    content=offer.encode(),
                    headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/sdp"},
                    timeout=timeout,
                )
            else:
                answer = _sdk_call(http_url, api_key, model, offer, session, timeout)
            if answer.status_code != 201:
                raise CallRefused(answer.status_code, answer.json())
            self.call_url = http_url + answer.headers["location"]
            self._run(self._connect(answer.text))
        except BaseException:
            self.close()
            raise

    def _run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout or self.timeout)

    async def _offer(self) -> str:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("oai-events")
        self.channel.on("message", self.received)
        self.channel.on("close", self.ended)
        self.pc.on("track", lambda track: asyncio.ensure_future(self._listen(track)))
        self.pc.on("connectionstatechange", self._state)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    def _state(self) -> None:
        if self.pc.connectionState in ("failed", "closed") and not self.closed:
            self.ended()

    async def _connect(self, answer: str) -> None:
        opened = asyncio.Event()
        self.channel.on("open", opened.set)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await opened.wait()

    async def _listen(self, track) -> None:
        try:
            while True:
                frame = await track.recv()
                peak = int(np.abs(frame.to_ndarray()).max(initial=0))
                self.heard.append((time.monotonic(), peak, float(frame.time)))
        except MediaStreamError:
            pass

    # ---- sending ----------------------------------------------------------------------------------

    def send(self, event: dict) -> None:
        self.loop.call_soon_threadsafe(self.channel.send, json.dumps(event))

    def say(self, pcm: bytes) -> float:
        """Speak `pcm` (pcm16 at 24 kHz) into the microphone; returns once it has been sent
        (time.monotonic() then)."""
        self.loop.call_soon_threadsafe(self.mic.pending.extend, pcm)
        time.sleep(len(pcm) / 2 / RATE)
        while self._run(self._pending()):
            time.sleep(0.02)
        return time.monotonic()

    async def _pending(self) -> int:
        return len(self.mic.pending)

    # ---- hearing ----------------------------------------------------------------------------------

    def sound_after(self, t: float) -> float | None:
        """When the first received frame with sound arrived after `t`, if one did."""
        return next((at for at, peak, _ in list(self.heard) if at > t and peak > HEARD_LEVEL), None)

    def sound_sent(self, after: float = -float("inf"), before: float = float("inf")) -> list[float]:
        """When the server sent each frame with sound heard so far that it sent between `after` and
        `before`, on this client's clock. Arrival times carry this client's own delay (the jitter
        buffer, a decoder thread starved on a busy machine) that events on the data channel do not;
        the server paces frames at real time, so a frame's media time, anchored by the frame that
        arrived soonest after its own, tells when it was due to leave (plus the least transit): no later
        than it left, so a frame sent late (the server starved) counts as sent earlier, never later."""
        heard = list(self.heard)
        offset = min((at - media for at, _, media in heard), default=0.0)
        sent = [(offset + media, peak) for _, peak, media in heard]
        return [at for at, peak in sent if peak > HEARD_LEVEL and after < at < before]

    def wait_sound(self, t: float, timeout: float | None = None) -> float:
        """When the first frame with sound after `t` arrived, waiting for it; TimeoutError if none."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while (at := self.sound_after(t)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no sound heard after {t:.3f}")
            time.sleep(0.01)
        return at

    def close(self) -> None:
        if hasattr(self, "pc"):
            self._run(self.pc.close(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
