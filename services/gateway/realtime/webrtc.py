"""Realtime over WebRTC, OpenAI's browser flow: the client POSTs an SDP offer to
`/v1/realtime/calls` (with an API key or a client secret) and gets the answer; its microphone comes
in as Opus over RTP, the responses' audio goes out the same way, and the realtime events travel as
JSON on the data channel the client opens (`oai-events`). The session is the WebSocket path's
`RealtimeSession`, so every policy behind it applies unchanged; only the audio takes the RTP track.
A camera track, when the offer has one (optional), is the session's camera (its frames join the
next turn: services/realtime/camera.py).

The playback position the scheduler and barge-in go by is the transport's own playout: audio is
paced onto the track at real time, and what has gone out has been played (less the browser's jitter
buffer, a few tens of ms).

ICE uses host candidates only (no STUN/TURN): peers must reach the gateway replica's addresses
directly (docs/webrtc.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

import av
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from starlette.datastructures import Headers, UploadFile

from services.common import untrusted_json
from services.common.errors import OmniError, bad_request
from services.extensions.ray.metrics import metric
from services.gateway.protocol import parse_form
from services.gateway.realtime.pacing import FramePacer
from services.gateway.realtime.transport import REFUSALS, Audio, Ending, serve
from services.quota.client_secrets import is_client_secret
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.codecs import PCM_RATE
from services.realtime.hub import RealtimeHub, Refused
from services.realtime.session import RealtimeSession

log = logging.getLogger(__name__)

MAX_SDP_BYTES = 64 * 1024  # browsers' offers are a few KiB
FORM_FIELDS = ("sdp", "session")  # OpenAI's call form
FRAME_SAMPLES = PCM_RATE // 50  # 20 ms: Opus's usual packet
INPUT_CHUNK_MS = 40  # microphone audio handed to the session (server VAD) this many ms at a time
MAX_PENDING = 250  # client events and audio chunks waiting for the session: ~10 s of audio
MAX_EARLY_EVENTS = 1000  # server events held until the data channel opens
FLUSH_S = 1.0  # at most this long for the data channel's last events before the call closes


class _Metrics:
    def __init__(self):
        self.calls = metric("omniray_gateway_webrtc_calls")
        self.dropped = metric("omniray_gateway_webrtc_input_dropped_seconds_total")
        self.playout_late = metric("omniray_gateway_webrtc_playout_late_seconds_total")


class Playout(MediaStreamTrack):
    """The responses' audio (pcm16 at 24 kHz) paced onto the peer connection at real time, silence
    between responses. `progress(item_id, played_ms)` and `events(event)` report what went out;
    `late(seconds)` the time the track fell behind real time and skipped (FramePacer)."""

    kind = "audio"

    def __init__(
        self,
        progress: Callable[[str, float], None],
        events: Callable[[se.ServerEvent], None],
        late: Callable[[float], None] | None = None,
    ):
        super().__init__()
        self._progress, self._report = progress, events
        self._queue: deque[list] = deque()  # [response_id, item_id, bytearray] in play order
        self._played_ms: dict[str, float] = {}  # by item
        self._done: set[str] = set()  # responses whose audio is all queued
        self._playing: str | None = None  # the response whose audio is going out
        self._pacer = FramePacer(on_late=late)

    def push(self, response_id: str, item_id: str, pcm16: bytes) -> None:
        if self._queue and self._queue[-1][1] == item_id:
            self._queue[-1][2] += pcm16
        else:
            self._queue.append([response_id, item_id, bytearray(pcm16)])

    def _queued(self, response_id: str) -> bool:
        return any(entry[0] == response_id for entry in self._queue)

    def finish(self, response_id: str) -> None:
        """No more audio comes for this response."""
        if self._playing == response_id and not self._queued(response_id):
            self._stopped()  # it has all gone out already
        elif self._queued(response_id):
            self._done.add(response_id)
        # else: nothing of it plays (text only, or cut): neither started nor stopped

    def clear(self, item_id: str | None = None) -> str | None:
        """Drop the audio not yet played (of `item_id` only, when given); the response whose audio
        was cut, if any (it ends `cleared`, not `stopped`)."""
        cut = None
        for entry in list(self._queue):
            if item_id is None or entry[1] == item_id:
                self._queue.remove(entry)
                cut = cut or entry[0]
        if cut is not None and not self._queued(cut):
            self._done.discard(cut)
            if self._playing == cut:
                self._playing = None
        return cut

    def _stopped(self) -> None:
        self._report(se.OutputAudioBufferStopped(response_id=self._playing))
        self._done.discard(self._playing)
        self._playing = None
        queued = {entry[1] for entry in self._queue}  # positions of items still to play
        self._played_ms = {item: ms for item, ms in self._played_ms.items() if item in queued}

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._pacer.wait()
        pcm = b""
        if self._queue:
            response_id, item_id, buffer = self._queue[0]
            if self._playing != response_id:
                self._playing = response_id
                self._report(se.OutputAudioBufferStarted(response_id=response_id))
            pcm = bytes(buffer[: FRAME_SAMPLES * 2])
            del buffer[: FRAME_SAMPLES * 2]
            played = self._played_ms.get(item_id, 0.0) + len(pcm) / 2 / PCM_RATE * 1000
            self._played_ms[item_id] = played
            self._progress(item_id, played)
            if not buffer:
                self._queue.popleft()
                if response_id in self._done and not self._queued(response_id):
                    self._stopped()
        return self._pacer.frame(pcm)


class Call:
    """One realtime session over one peer connection."""

    def __init__(self, pc: RTCPeerConnection, metrics: _Metrics):
        self.id = se.new_id("rtc")
        self.pc, self.metrics = pc, metrics
        self.session: RealtimeSession | None = None
        self.channel = None
        self.early: list[str] = []  # server events before the data channel opened
        self.playout = Playout(self._progress, self._emit, self._late)
        self.pending: asyncio.Queue = asyncio.Queue(MAX_PENDING)  # ("event", text) | ("audio", pcm16)
        self.over = asyncio.Event()
        self.connected = False  # ICE and DTLS up (the peer connection's state)
        self._tasks: set[asyncio.Task] = set()
        self._cleared: str | None = None  # the response whose audio this call last said was cleared

    # ---- server events out ----------------------------------------------------------------------

    def _emit(self, event: se.ServerEvent) -> None:
        text = se.to_json(event)
        if self.channel is None or self.channel.readyState != "open":
            if len(self.early) < MAX_EARLY_EVENTS:
                self.early.append(text)
            return
        try:
            self.channel.send(text)
        except ValueError:  # over the peer's message size (a large item retrieved): said, not sent
            too_large = se.error(f"a {event.type} event of {len(text)} bytes is over the data channel's "
                                 "message size and was not sent", "event_too_large", kind="server_error")  # fmt: skip
            self.channel.send(se.to_json(too_large))
        except Exception:  # the channel closed under us: the call is ending
            self.over.set()

    async def send(self, event: se.ServerEvent) -> None:
        """The session's events: audio onto the track, everything else onto the data channel."""
        if isinstance(event, se.ResponseOutputAudioDelta):  # pcm16: the session's audio for a track
            self.playout.push(event.response_id, event.item_id, event.delta)
            return
        if isinstance(event, se.ResponseDone):
            self.playout.finish(event.response.id)
        if isinstance(event, se.OutputAudioBufferCleared):  # the client's clear, answered by the session
            self.playout.clear()
            if event.response_id is not None and event.response_id == self._cleared:
                return  # already said, after the truncation that came first
        self._emit(event)
        # a cut (barge-in, truncate, the client's clear): what was not heard is dropped
        if isinstance(event, se.ConversationItemTruncated) and (cut := self.playout.clear(event.item_id)):
            self._cleared = cut
            self._emit(se.OutputAudioBufferCleared(response_id=cut))

    def _late(self, seconds: float) -> None:
        self.metrics.playout_late.inc(seconds)

    def _progress(self, item_id: str, played_ms: float) -> None:
        if self.session is not None:
            self.session.played(item_id, played_ms)

    # ---- peer connection in ---------------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        """A call's task that fails (a bug) ends the call, logged; it does not leave it half alive."""
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("webrtc call %s: %s failed", self.id, task.get_coro().__name__, exc_info=error)
            self.over.set()

    def on_datachannel(self, channel) -> None:
        if self.channel is not None:  # the events travel on the first one
            return
        self.channel = channel

        @channel.on("open")
        def _open():
            early, self.early = self.early, []
            for text in early:
                channel.send(text)

        @channel.on("message")
        def _message(message):
            try:
                self.pending.put_nowait(("event", message))
            except asyncio.QueueFull:
                self._emit(se.error("too many client events waiting; slow down", "rate_limit_exceeded"))

        channel.on("close", self.over.set)
        if channel.readyState == "open":
            _open()

    def on_track(self, track) -> None:
        if track.kind == "audio":
            self._spawn(self._microphone(track))
        elif track.kind == "video":
            self._spawn(self._camera(track))

    async def _camera(self, track) -> None:
        """The client's camera: every frame is received (the track's queue stays short), and those
        within the session's camera frame rate are converted and shown to it
        (services/realtime/camera.py: recent key frames join the next turn)."""
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                camera = self.session.camera if self.session is not None else None
                if camera is not None and camera.takes_images and camera.due():
                    camera.offer(await asyncio.to_thread(frame.to_ndarray, format="rgb24"))

    async def _microphone(self, track) -> None:
        """The client's audio, resampled to the session's pcm16 at 24 kHz, in INPUT_CHUNK_MS chunks."""
        resampler = av.AudioResampler(format="s16", layout="mono", rate=PCM_RATE)
        chunk, step = bytearray(), PCM_RATE * INPUT_CHUNK_MS // 1000 * 2
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                for out in resampler.resample(frame):
                    chunk += bytes(out.planes[0])[: out.samples * 2]
                if len(chunk) < step:
                    continue
                try:
                    self.pending.put_nowait(("audio", bytes(chunk)))
                except asyncio.QueueFull:  # the session is behind: this audio is lost, counted
                    self.metrics.dropped.inc(len(chunk) / 2 / PCM_RATE)
                chunk.clear()

    async def receive(self) -> str | Audio | None:
        """The next client event (data channel) or microphone chunk, in order; None once the call is
        over (the peer left or never connected, or it was hung up)."""
        get, over = asyncio.ensure_future(self.pending.get()), asyncio.ensure_future(self.over.wait())
        try:
            await asyncio.wait({get, over}, return_when=asyncio.FIRST_COMPLETED)
            if self.over.is_set():  # what is still queued is not served: the call is over
                return None
            kind, data = get.result()
            return data if kind == "event" else Audio(data)
        finally:
            get.cancel()
            over.cancel()

    async def close(self, ending: Ending) -> None:
        """Let the last events (a migration's, a take-over's, the idle timeout's) leave before the
        connection closes."""
        deadline = time.monotonic() + FLUSH_S
        while self.channel is not None and self.channel.readyState == "open" and self.channel.bufferedAmount:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.02)

    # ---- lifetime -------------------------------------------------------------------------------

    async def run(self, hub: RealtimeHub) -> None:
        """Serve the call until the peer leaves (or never connects), the session ends (idle, resumed
        elsewhere, moved off a draining replica) or it is hung up; then let everything go."""
        self.session.ended.add_done_callback(lambda _: self.over.set())
        connect_s = self.session.profile.realtime.webrtc_connect_timeout_s
        deadline = asyncio.get_running_loop().call_later(connect_s, self._not_connected, connect_s)
        try:
            await serve(self.session, self)
        finally:
            deadline.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)  # out of the session before it closes
            try:
                await self.pc.close()  # stops its tracks too
            finally:
                await hub.close(self.session)

    def _not_connected(self, connect_s: float) -> None:
        if not self.connected:
            log.info("webrtc call %s: peer not connected in %.0f s", self.id, connect_s)
            self.over.set()

    def on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self.connected = True
        elif state in ("failed", "closed"):
            self.over.set()


async def read_offer(body: bytes, headers: Headers) -> tuple[str, dict | None]:
    """A call's SDP offer and the session settings sent with it (None: none sent): the offer as
    the body (`application/sdp`, as a browser sends it), or OpenAI's form (`multipart/form-data`:
    `sdp`, and `session` as JSON, as the OpenAI SDK's `realtime.calls.create` sends it)."""
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "application/sdp":
        return check_offer(body), None
    if media_type != "multipart/form-data":
        raise OmniError(415, "send the SDP offer as the body (Content-Type: application/sdp) or as the "
                        "'sdp' field of a multipart/form-data form", code="unsupported_media_type")  # fmt: skip
    form = await parse_form(body, headers, max_files=len(FORM_FIELDS), max_part_size=ev.MAX_SESSION_BYTES)
    try:
        fields: dict[str, bytes] = {}
        for name, value in form.multi_items():
            if name not in FORM_FIELDS:
                raise bad_request(
                    f"unknown form field {name[:64]!r}", code="unknown_parameter", param=name[:64]
                )
            if name in fields:
                raise bad_request(f"form field {name!r} is given twice", param=name)
            fields[name] = await value.read() if isinstance(value, UploadFile) else value.encode()
    finally:
        await form.close()
    if "sdp" not in fields:
        raise bad_request("the form has no 'sdp' field (the SDP offer)", param="sdp")
    session = None
    if "session" in fields:
        try:
            session = untrusted_json.loads(fields["session"])
        except untrusted_json.JsonLimitError as e:
            raise bad_request(f"session: {e.message}", code=e.code, param="session") from None
        if not isinstance(session, dict):
            raise bad_request("session must be a JSON object", param="session")
    return check_offer(fields["sdp"]), session


def check_offer(body: bytes) -> str:
    if len(body) > MAX_SDP_BYTES:
        raise OmniError(413, f"SDP offer is larger than {MAX_SDP_BYTES} bytes", code="request_too_large")
    try:
        sdp = body.decode()
    except UnicodeDecodeError:
        raise bad_request("SDP offer is not UTF-8 text", code="invalid_sdp") from None
    if not any(line.startswith("m=audio ") for line in sdp.splitlines()):
        raise bad_request("the SDP offer has no audio (m=audio): the call needs a microphone track",
                          code="invalid_sdp")  # fmt: skip
    return sdp


class Calls:
    """The WebRTC calls of one gateway replica."""

    def __init__(self, hub: RealtimeHub):
        self.hub = hub
        self.live: dict[str, Call] = {}
        self.metrics = _Metrics()

    async def answer(
        self,
        offer: str,
        api_key: str | None,
        model: str | None,
        resume: str | None,
        settings: dict | None = None,
    ) -> tuple[Call, str]:
        """Open a session for the offer, with `settings` (checked) if the caller sent them: the call
        and the SDP answer. A bad offer is a 400 before the key is looked at (a client secret is not
        used up on it); a refused session is the WebSocket path's refusal as an HTTP error."""
        if is_client_secret(api_key):
            if settings is not None:  # the server that minted it fixed them; the browser may not
                raise bad_request("a client secret's session settings are fixed when it is minted: "
                                  "send the offer alone", code="invalid_request", param="session")  # fmt: skip
        else:  # a peer connection only for a known key (a secret: at open)
            await self.hub.quota.authenticate(api_key)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only
        call = Call(pc, self.metrics)
        pc.on("datachannel", call.on_datachannel)
        pc.on("track", call.on_track)
        pc.on("connectionstatechange", call.on_connection_state)
        try:
            try:
                await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            except Exception:  # aiortc raises whatever its parser meets; the text stays here
                raise bad_request(
                    "the SDP offer could not be parsed or negotiated", code="invalid_sdp"
                ) from None
            try:
                call.session = await self.hub.open(
                    api_key, model, call.send, resume, settings, audio_track=True
                )
            except Refused as refused:
                e = refused.event.error
                raise OmniError(REFUSALS[refused.reason].http, e.message, code=e.code, type=e.type) from None
            pc.addTrack(call.playout)
            try:
                await pc.setLocalDescription(await pc.createAnswer())
            except Exception:  # an offer aiortc parsed but cannot answer (no usable audio section)
                raise bad_request("the SDP offer could not be negotiated", code="invalid_sdp") from None
        except BaseException:
            if call.session is not None:
                await self.hub.close(call.session)
            await pc.close()
            raise
        self.live[call.id] = call
        self.metrics.calls.set(len(self.live))
        task = asyncio.create_task(call.run(self.hub))
        task.add_done_callback(lambda _: self._ended(call))
        return call, pc.localDescription.sdp

    def _ended(self, call: Call) -> None:
        self.live.pop(call.id, None)
        self.metrics.calls.set(len(self.live))

    def hang_up(self, call_id: str, tenant_id: str) -> None:
        call = self.live.get(call_id)
        if call is None or call.session.tenant.id != tenant_id:
            raise OmniError(404, f"no call {call_id[:64]!r} on this server", code="call_not_found")
        call.over.set()
