"""The gateway deployment: OpenAI-compatible REST (FastAPI ingress) and gRPC `omni.v1.Omni`, both
in front of the one Pipeline."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, Response, StreamingResponse
from omni.v1 import common_pb2, omni_pb2
from opentelemetry import trace
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.common import telemetry
from services.common.errors import OmniError, internal_error, too_large
from services.extensions.ray.metrics import metric
from services.gateway import audio_api, grpc_wire, openai_api, realtime_auth, responses_api, webrtc
from services.gateway.audio_files import SpeechFile
from services.gateway.grpc_wire import SESSION_HEADER, SLO_HEADER, Undecodable
from services.gateway.playback import Playback
from services.gateway.quota import quota_service
from services.models.profile import Profile
from services.pipeline.events import Event
from services.pipeline.pipeline import Pipeline
from services.pipeline.prepared import Prepared
from services.pipeline.prompt import PromptBuilder
from services.pipeline.stage_calls import StageHandles
from services.pipeline.tools import CallDelta, joined
from services.pipeline.transcription import Transcription
from services.quota.tenants import TenantSpec
from services.realtime import grpc_events
from services.realtime import server_events as se
from services.realtime.hub import RealtimeHub, Refused

logger = logging.getLogger("ray.serve")


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


api = FastAPI(title="omniray", docs_url=None, redoc_url=None)


@api.exception_handler(OmniError)
async def _omni_error(_: Request, e: OmniError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
    # Starlette's own answers (unknown path, wrong method) in OpenAI's shape too.
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "invalid_request")
    err = OmniError(e.status_code, str(e.detail), code=code)
    return JSONResponse(err.body(), status_code=e.status_code, headers=e.headers)


@api.exception_handler(Exception)
async def _unexpected(_: Request, e: Exception) -> JSONResponse:
    err = internal_error(e)
    return JSONResponse(err.body(), status_code=err.status)


class _Metrics:
    def __init__(self):
        self.requests = metric("omniray_gateway_requests_total")
        self.ttft = metric("omniray_gateway_ttft_seconds")
        self.ttfp = metric("omniray_audio_ttfp_seconds")
        self.e2e = metric("omniray_gateway_e2e_seconds")
        self.rtf = metric("omniray_gateway_audio_rtf_ratio")
        self.audio_sent = metric("omniray_gateway_audio_sent_seconds_total")
        # a stall-free run still shows the series (at 0)
        self.audio_stall = metric("omniray_gateway_audio_stall_seconds_total", api=("rest", "grpc"))


# Refused realtime sessions: gRPC status codes, and WebSocket close codes.
GRPC_REFUSAL = {"unauthenticated": grpc.StatusCode.UNAUTHENTICATED, "not_found": grpc.StatusCode.NOT_FOUND,
                "limit": grpc.StatusCode.RESOURCE_EXHAUSTED, "unavailable": grpc.StatusCode.UNAVAILABLE}  # fmt: skip
MODEL_HEADER = "x-omniray-model"  # gRPC realtime: the model asked for (optional)
# Resume a saved realtime session (docs/realtime.md "Reconnect"): WebSocket query / gRPC metadata
RESUME_PARAM = "session_id"
RESUME_HEADER = "x-omniray-session-id"
WS_CLOSE = {"unauthenticated": (1008, "unauthorized"), "not_found": (1008, "not found"),
            "limit": (se.TRY_AGAIN_LATER, "try again later"),
            "unavailable": (se.TRY_AGAIN_LATER, "try again later")}  # fmt: skip


CONSOLE_DIR = Path(__file__).parent / "console"
CONSOLE_FILES = {"index.html": "text/html", "console.js": "text/javascript", "console.css": "text/css"}
# The page loads only its own files and talks only to this gateway; microphone audio and the
# answer's stream are media, images the user picks are data: URLs.
CONSOLE_CSP = ("default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob: mediastream:; "
               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
               "frame-ancestors 'none'")  # fmt: skip


def _console_file(name: str) -> Response:
    if name not in CONSOLE_FILES:
        raise OmniError(404, "no such console file", code="not_found")
    return Response((CONSOLE_DIR / name).read_bytes(), media_type=CONSOLE_FILES[name],
                    headers={"content-security-policy": CONSOLE_CSP, "cache-control": "no-cache",
                             "x-content-type-options": "nosniff"})  # fmt: skip


async def _grpc_status(chunks: AsyncIterator, grpc_context, what: str) -> AsyncIterator:
    """A gRPC method's chunks; every failure leaves with a status code and details set here
    (Serve's proxy would otherwise send INTERNAL with the exception's text)."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as e:
        err = e if isinstance(e, OmniError) else internal_error(e, what)
        if grpc_context is None:
            raise err from None
        grpc_context.set_code(err.grpc_code)
        # Serve's proxy does not forward a replica's trailing metadata on errors, so the
        # rate-limit headers ride in the details, after the message: "msg [k=v; k=v]".
        headers = "; ".join(f"{k}={v}" for k, v in err.headers.items())
        grpc_context.set_details(f"{err.message} [{headers}]" if headers else err.message)
        raise err from None


@serve.deployment
@serve.ingress(api)
class Gateway:
    def __init__(
        self,
        profile: dict,
        encoder: DeploymentHandle,
        prefill: DeploymentHandle,
        decode: DeploymentHandle,
        talker: DeploymentHandle,
        vocoder: DeploymentHandle,
        async_chunk: bool | None = None,
    ):
        self.profile = Profile.model_validate(profile)
        self.handles = StageHandles(encoder, prefill, decode, talker, vocoder)
        prompts = PromptBuilder(str(self.profile.model_path(self.profile.models.thinker)))
        self.quota = quota_service()
        self.pipeline = Pipeline(self.profile, self.handles, prompts, self.quota, async_chunk=async_chunk)
        self.metrics = _Metrics()
        self.realtime_hub = RealtimeHub(self.pipeline, self.profile, self.quota)
        self.calls = webrtc.Calls(self.realtime_hub)

    # ---- observation helpers ------------------------------------------------------------

    async def _observed(
        self, api_name: str, events: AsyncIterator[Event], arrival: float, span: trace.Span
    ) -> AsyncIterator[Event]:
        """The response's events, measured; the request's span ends with the stream."""
        first_text = True
        code = "ok"
        tags = {"api": api_name}
        playback, last_audio = Playback(), arrival
        try:
            async for ev in events:
                now = time.perf_counter()
                if (ev.is_text or ev.text) and first_text:
                    first_text = False
                    self.metrics.ttft.observe(now - arrival)
                if ev.pcm16 and ev.sample_rate:
                    if playback.start is None:
                        self.metrics.ttfp.observe(now - arrival)
                    seconds = len(ev.pcm16) / 2 / ev.sample_rate
                    if stall := playback.receive(now, seconds):
                        self.metrics.audio_stall.inc(stall, tags=tags)
                    self.metrics.audio_sent.inc(seconds, tags=tags)
                    last_audio = now
                yield ev
        except BaseException as e:
            code = "error"
            span.record_exception(e)
            span.set_status(trace.StatusCode.ERROR)
            raise
        finally:
            span.set_attribute("omniray.audio_seconds", playback.audio_s)
            span.end()
            self.metrics.requests.inc(tags={"api": api_name, "code": code})
            self.metrics.e2e.observe(time.perf_counter() - arrival, tags=tags)
            if playback.audio_s:
                self.metrics.rtf.observe((last_audio - arrival) / playback.audio_s, tags=tags)

    @contextlib.asynccontextmanager
    async def _admitting(
        self, api_name: str, op: str, carrier
    ) -> AsyncIterator[tuple[trace.Span, TenantSpec]]:
        """A request's root span and its tenant (from the key in `carrier`: HTTP headers or gRPC
        metadata); a client error raised in the block (key, body, validation, quota) is counted
        under `api_name` before it leaves."""
        with telemetry.request_span("gateway", op, carrier) as span:
            try:
                yield span, await self.quota.authenticate(bearer_token(carrier.get("authorization")))
            except OmniError as e:
                self.metrics.requests.inc(tags={"api": api_name, "code": str(e.status)})
                raise

    # ---- REST ---------------------------------------------------------------------------

    async def _read_json(self, request: Request):
        return openai_api.parse_body(await self._read_body(request))

    async def _read_body(self, request: Request) -> bytes:
        limit = self.profile.limits.max_request_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise too_large(f"request body is larger than {limit} bytes", code="request_too_large")
        body = bytearray()
        try:
            async with asyncio.timeout(self.profile.limits.body_read_timeout_s):
                async for part in request.stream():
                    body += part
                    if len(body) > limit:
                        raise too_large(
                            f"request body is larger than {limit} bytes", code="request_too_large"
                        )
        except TimeoutError:
            raise OmniError(
                408,
                f"request body not received within {self.profile.limits.body_read_timeout_s:g} s",
                code="request_timeout",
            ) from None
        return bytes(body)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        arrival = time.perf_counter()
        async with self._admitting("rest", "gateway.chat", request.headers) as (span, tenant):
            body = await self._read_json(request)
            req, turn = openai_api.parse_request(
                body,
                self.profile.limits,
                session=request.headers.get(SESSION_HEADER, ""),
                slo_class=request.headers.get(SLO_HEADER, ""),
            )
            prepared = await self.pipeline.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)  # generation's stage spans are children of the request's
        events = self._observed("rest", self.pipeline.generate(prepared), arrival, span)
        rid, model, created = prepared.ctx.request_id, self.profile.served_model_name, int(time.time())
        speak = prepared.plan.speak
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._sse(events, rid, model, created, speak, include_usage),
                media_type="text/event-stream",
                headers=prepared.lease.headers,
            )
        text, pcm, rate, finish, usage = [], bytearray(), 0, "stop", common_pb2.Usage()
        deltas: list[CallDelta] = []
        async for ev in events:
            text.append(ev.text)
            deltas += ev.calls
            pcm += ev.pcm16
            rate = ev.sample_rate or rate
            if ev.finish_reason:
                finish, usage = ev.finish_reason, ev.usage or usage
        audio = None
        if speak:
            audio = openai_api.audio_message(
                f"audio_{uuid.uuid4().hex}", bytes(pcm), rate or 24000, prepared.audio_format, "".join(text)
            )
        calls = joined(deltas) if deltas else None
        return JSONResponse(
            openai_api.completion(rid, model, created, "".join(text), finish, usage, audio, calls),
            headers=prepared.lease.headers,
        )

    async def _sse(
        self,
        events: AsyncIterator[Event],
        rid: str,
        model: str,
        created: int,
        speak: bool,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        def line(obj: dict) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        audio_id = f"audio_{uuid.uuid4().hex}"
        yield line(openai_api.chunk(rid, model, created, {"role": "assistant", "content": ""}))
        try:
            async for ev in events:
                if ev.progress is not None:
                    # Documents: encoder progress as a chunk with no choices (OpenAI SDKs skip those).
                    yield line(openai_api.progress_chunk(rid, model, created, ev.progress))
                if ev.is_text or ev.text:
                    # As OpenAI: with audio out the words stream as the audio's transcript. Tokens
                    # whose text is empty go out too (as vLLM's server sends them).
                    delta = (
                        {"audio": {"id": audio_id, "transcript": ev.text}} if speak else {"content": ev.text}
                    )
                    yield line(openai_api.chunk(rid, model, created, delta))
                if ev.calls:  # after the words before them (one event may carry both)
                    calls = [openai_api.tool_call_delta(d) for d in ev.calls]
                    yield line(openai_api.chunk(rid, model, created, {"tool_calls": calls}))
                if ev.pcm16:
                    yield line(
                        openai_api.chunk(
                            rid,
                            model,
                            created,
                            {
                                "audio": {
                                    "id": audio_id,
                                    "data": base64.b64encode(ev.pcm16).decode(),
                                    "sample_rate": ev.sample_rate,
                                }
                            },
                        )
                    )
                if ev.finish_reason:
                    yield line(openai_api.chunk(rid, model, created, {}, ev.finish_reason))
                    if include_usage and ev.usage is not None:
                        yield line(openai_api.usage_chunk(rid, model, created, ev.usage))
        except OmniError as e:  # headers are gone: report in-band, then end the stream cleanly
            yield line(e.body())
        except Exception as e:
            yield line(internal_error(e, "generation failed").body())
        yield "data: [DONE]\n\n"

    @api.post("/v1/responses")
    async def responses(self, request: Request):
        """OpenAI's Responses API over the same pipeline (services/gateway/responses_api.py)."""
        arrival = time.perf_counter()
        async with self._admitting("responses", "gateway.responses", request.headers) as (span, tenant):
            req, turn = responses_api.parse(
                await self._read_json(request),
                self.profile.limits,
                session=request.headers.get(SESSION_HEADER, ""),
                slo_class=request.headers.get(SLO_HEADER, ""),
            )
            prepared = await self.pipeline.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)
        events = self._observed("responses", self.pipeline.generate(prepared), arrival, span)
        out = responses_api.Rendered(
            req, self.profile.served_model_name, prepared.plan.speak, prepared.audio_format
        )
        if req.stream:
            return StreamingResponse(
                self._responses_sse(out, events),
                media_type="text/event-stream",
                headers=prepared.lease.headers,
            )
        return JSONResponse(await out.whole(events), headers=prepared.lease.headers)

    @staticmethod
    async def _responses_sse(out, events) -> AsyncIterator[str]:
        try:
            async for line in out.stream(events):
                yield line
        except OmniError as e:  # headers are gone: the stream ends with response.failed
            yield out.failed(e.body()["error"])
        except Exception as e:
            yield out.failed(internal_error(e, "response failed").body()["error"])

    # ---- Audio endpoints -------------------------------------------------------------------

    @api.post("/v1/audio/speech")
    async def audio_speech(self, request: Request):
        arrival = time.perf_counter()
        async with self._admitting("speech", "gateway.speech", request.headers) as (span, tenant):
            req, turn = audio_api.speech_request(await self._read_json(request))
            prepared = await self.pipeline.speech.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)
        file = SpeechFile(req.response_format, req.speed)
        chunks = self._speech_chunks(prepared, file, arrival, span)
        if req.stream_format == "sse":
            return StreamingResponse(
                self._speech_sse(chunks), media_type="text/event-stream", headers=prepared.lease.headers
            )
        # The status goes out with the first bytes: a failure before them is its own error (a 503
        # when a stage is gone), not a 200 with an empty file.
        first = await self._first_bytes(chunks)
        return StreamingResponse(
            self._speech_bytes(first, chunks), media_type=file.content_type, headers=prepared.lease.headers
        )

    async def _speech_chunks(self, p: Prepared, file: SpeechFile, arrival: float, span, api_name="speech"):
        """(bytes of the file, usage at the end) as the speech is made."""
        async for ev in self._observed(api_name, self.pipeline.speech.synthesize(p), arrival, span):
            if ev.pcm16 and (data := file.push(ev.pcm16)):
                yield data, None
            if ev.finish_reason:
                yield file.close(), ev.usage

    @staticmethod
    async def _first_bytes(chunks) -> bytes:
        async for data, _ in chunks:
            if data:
                return data
        return b""

    @staticmethod
    async def _speech_bytes(first: bytes, chunks) -> AsyncIterator[bytes]:
        yield first
        try:
            async for data, _ in chunks:
                if data:
                    yield data
        except Exception as e:
            # The status is gone: the body is cut off before its end (no last chunk), which the
            # client sees as a failed transfer, not a short file. Logged by id.
            internal_error(e, "speech failed")
            raise

    @staticmethod
    async def _speech_sse(chunks) -> AsyncIterator[str]:
        try:
            async for data, usage in chunks:
                if data:
                    yield audio_api.speech_sse(data)
                if usage is not None:
                    yield audio_api.speech_sse(None, usage)
        except OmniError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
        except Exception as e:
            yield f"data: {json.dumps(internal_error(e, 'speech failed').body())}\n\n"

    @api.post("/v1/audio/transcriptions")
    async def audio_transcriptions(self, request: Request):
        arrival = time.perf_counter()
        async with self._admitting("transcription", "gateway.transcription", request.headers) as (
            span,
            tenant,
        ):
            limits = self.profile.limits
            form, data = await audio_api.read_form(await self._read_body(request), request.headers, limits)
            turn = await asyncio.to_thread(audio_api.transcription_turn, form, data, limits)
            t = await self.pipeline.transcription.prepare(turn, tenant, "transcription")
            telemetry.inject(t.ctx)
        segments = self._transcribed(t, arrival, span)
        if form.stream:
            return StreamingResponse(
                self._transcript_sse(segments, t), media_type="text/event-stream", headers=t.lease.headers
            )
        collected = [s async for s in segments]
        body, media_type = audio_api.transcript_body(form.response_format, collected, t.turn.audio.seconds)
        if isinstance(body, dict):
            return JSONResponse(body, headers=t.lease.headers)
        return Response(body, media_type=media_type, headers=t.lease.headers)

    async def _transcribed(self, t: Transcription, arrival: float, span):
        """The transcriber's segments, measured; the request's span ends with them."""
        code = "ok"
        try:
            async for segment in self.pipeline.transcription.transcribe(t):
                yield segment
        except BaseException as e:
            code = "error"
            span.record_exception(e)
            span.set_status(trace.StatusCode.ERROR)
            raise
        finally:
            span.end()
            self.metrics.requests.inc(tags={"api": t.api, "code": code})
            self.metrics.e2e.observe(time.perf_counter() - arrival, tags={"api": t.api})

    @staticmethod
    async def _transcript_sse(segments, t: Transcription) -> AsyncIterator[str]:
        texts = []
        try:
            async for segment in segments:
                texts.append(segment.text)
                yield audio_api.transcript_sse(segment)
            yield audio_api.transcript_sse(None, " ".join(texts).strip(), t.turn.audio.seconds)
        except OmniError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
        except Exception as e:
            yield f"data: {json.dumps(internal_error(e, 'transcription failed').body())}\n\n"

    # ---- Realtime (WebSocket) ------------------------------------------------------------

    @api.post("/v1/realtime/client_secrets")
    async def client_secrets(self, request: Request):
        """An ephemeral, single-use key for one realtime session of the caller's tenant
        (services/gateway/realtime_auth.py)."""
        async with self._admitting("client_secrets", "gateway.client_secrets", request.headers) as (
            _,
            tenant,
        ):
            asked = openai_api.validated(realtime_auth.ClientSecretRequest, await self._read_json(request))
            config = realtime_auth.session_settings(asked.session, self.profile)
            value, expires_at = await self.quota.mint_secret(
                tenant, asked.session, asked.expires_after.seconds
            )
        self.metrics.requests.inc(tags={"api": "client_secrets", "code": "ok"})
        session = {**config.model_dump(), "model": config.model or self.profile.served_model_name}
        return {"value": value, "expires_at": expires_at, "session": session}

    @api.post("/v1/realtime/calls")
    async def realtime_call(self, request: Request):
        """OpenAI Realtime over WebRTC: an SDP offer in (with session settings, in OpenAI's form),
        the answer out (201, `Location` names the call); the session then runs on the peer
        connection (services/gateway/webrtc.py)."""
        try:
            offer, session = await webrtc.read_offer(await self._read_body(request), request.headers)
            if session is not None:
                realtime_auth.session_settings(session, self.profile)
            call, answer = await self.calls.answer(
                offer,
                bearer_token(request.headers.get("authorization")),
                request.query_params.get("model"),
                request.query_params.get(RESUME_PARAM),
                session,
            )
        except OmniError as e:
            self.metrics.requests.inc(tags={"api": "webrtc", "code": str(e.status)})
            raise
        self.metrics.requests.inc(tags={"api": "webrtc", "code": "ok"})
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"location": f"/v1/realtime/calls/{call.id}"})  # fmt: skip

    @api.post("/v1/realtime/calls/{call_id}/hangup")
    async def realtime_hangup(self, call_id: str, request: Request):
        """End a WebRTC call of the caller's tenant (on the replica that holds it)."""
        tenant = await self.quota.authenticate(bearer_token(request.headers.get("authorization")))
        self.calls.hang_up(call_id, tenant.id)
        return Response(status_code=200)

    @api.websocket("/v1/realtime")
    async def realtime(self, ws: WebSocket):
        """OpenAI Realtime over a WebSocket: typed events in services/realtime/events.py, one
        `RealtimeSession` per connection. Refusals (key, model) are an `error` event, then close.
        A browser sends its key (or a client secret) as a subprotocol, and is answered `realtime`."""
        subprotocols = ws.scope.get("subprotocols") or []
        await ws.accept(
            subprotocol=realtime_auth.SUBPROTOCOL if realtime_auth.SUBPROTOCOL in subprotocols else None
        )

        async def send(event: se.ServerEvent) -> None:
            await ws.send_text(se.to_json(event))

        try:
            session = await self.realtime_hub.open(
                bearer_token(ws.headers.get("authorization")) or realtime_auth.subprotocol_key(subprotocols),
                ws.query_params.get("model"),
                send,
                ws.query_params.get(RESUME_PARAM),
            )
        except Refused as refused:
            await send(refused.event)
            code, reason = WS_CLOSE[refused.reason]
            await ws.close(code=code, reason=reason)
            return
        self.metrics.requests.inc(tags={"api": "realtime", "code": "ok"})
        try:
            while True:
                message = await self._next_client_event(session, ws.receive)
                if message is None:
                    if session.moved:  # 1012: service restart; reconnect with the session id
                        await ws.close(code=1012, reason="server draining: reconnect with session_id")
                    else:
                        await ws.close(code=1000, reason="resumed elsewhere" if session.taken else "idle")
                    break
                if message["type"] == "websocket.disconnect":
                    break
                await session.handle(message.get("text") or message.get("bytes") or b"")
        except WebSocketDisconnect:
            pass
        finally:
            await self.realtime_hub.close(session)

    async def _next_client_event(self, session, receive):
        """The client's next event; None once the session has been idle too long (told so with an
        `error` event), was resumed by another connection or moved off this draining replica.
        Waiting while a response plays out is not idling."""
        idle_s = self.profile.realtime.idle_timeout_s
        # One receive for the whole wait: cancelling a stream's read half-way can break the stream.
        pending = asyncio.ensure_future(receive())
        ended = session.ended  # resumed by another connection (a future of the session's: not cancelled here)
        try:
            while True:
                done, _ = await asyncio.wait(
                    {pending, ended}, timeout=idle_s, return_when=asyncio.FIRST_COMPLETED
                )
                if ended in done:
                    return None
                if done:
                    return pending.result()
                if not session.busy:
                    await session.send(
                        se.error(
                            f"no client event for {idle_s:g} s: the session is closed", "session_idle_timeout"
                        )
                    )
                    return None
        finally:
            pending.cancel()

    @api.get("/console")
    async def console(self):
        """The voice console: talk to the model from a browser (services/gateway/console/)."""
        return _console_file("index.html")

    @api.get("/console/{name}")
    async def console_asset(self, name: str):
        return _console_file(name)

    @api.get("/v1/models")
    async def models(self):
        card = self._model_card()
        # an alias is the same model under another name (vLLM's `root`: what it serves)
        aliases = [{**card, "id": name, "root": card["id"]} for name in self.profile.aliases.models]
        return {"object": "list", "data": [card, *aliases]}

    def _model_card(self) -> dict:
        m = self.profile.models
        inputs = ["text"] + (["image"] if m.vision else []) + (["audio"] if m.audio else [])
        outputs = ["text"] + ([] if self.profile.speech_out_unavailable() else ["audio"])
        return {
            "id": self.profile.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "omniray",
            "input_modalities": inputs,
            "output_modalities": outputs,
            "root": self.profile.served_model_name,
            # omniray's: the voices `audio.voice` takes (a token talker's are its speakers), then
            # the other names they answer to (profile `aliases.voices`)
            "voices": self.profile.voice_names() if "audio" in outputs else [],
        }

    @api.get("/health")
    async def health(self):
        return {"status": "ok", "profile": self.profile.name}

    # ---- gRPC (omni.v1.Omni through Serve's gRPC proxy) -----------------------------------

    async def Chat(
        self, request: omni_pb2.ChatRequest, grpc_context=None
    ) -> AsyncIterator[omni_pb2.ChatChunk]:
        """omni.v1.Omni/Chat."""
        async for chunk in _grpc_status(self._chat(request, grpc_context), grpc_context, "gRPC chat failed"):
            yield chunk

    async def _chat(self, request: omni_pb2.ChatRequest, grpc_context) -> AsyncIterator[omni_pb2.ChatChunk]:
        if isinstance(request, Undecodable):
            raise request.error()
        arrival = time.perf_counter()
        metadata = dict(grpc_context.invocation_metadata()) if grpc_context else {}
        async with self._admitting("grpc", "gateway.chat", metadata) as (span, tenant):
            turn = grpc_wire.chat_turn(request, self.profile.limits, metadata)
            prepared = await self.pipeline.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)  # generation's stage spans are children of the request's
        rid, model = prepared.ctx.request_id, self.profile.served_model_name
        deltas: list[CallDelta] = []  # the calls go out whole, before the last chunk
        async for ev in self._observed("grpc", self.pipeline.generate(prepared), arrival, span):
            if ev.progress is not None:
                yield omni_pb2.ChatChunk(id=rid, model=model, progress=ev.progress)
            deltas += ev.calls
            if ev.text:
                yield omni_pb2.ChatChunk(id=rid, model=model, text=ev.text)
            if ev.pcm16:
                yield omni_pb2.ChatChunk(
                    id=rid,
                    model=model,
                    audio=omni_pb2.AudioDelta(
                        pcm16=ev.pcm16, sample_rate=ev.sample_rate, transcript=ev.transcript or ""
                    ),
                )
            if ev.finish_reason:
                if deltas:
                    calls = [omni_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                             for c in joined(deltas)]  # fmt: skip
                    yield omni_pb2.ChatChunk(id=rid, model=model, tool_calls=calls)
                yield omni_pb2.ChatChunk(id=rid, model=model, finish_reason=ev.finish_reason, usage=ev.usage)

    async def Realtime(
        self, request_stream: AsyncIterator[omni_pb2.RealtimeClientEvent], grpc_context=None
    ) -> AsyncIterator[omni_pb2.RealtimeServerEvent]:
        """omni.v1.Omni/Realtime: the WebSocket's session over a bidirectional gRPC stream (Serve's
        proxy carries it); client events converted by services/realtime/grpc_events.py, server events
        encoded by services/realtime/server_events.py."""
        metadata = dict(grpc_context.invocation_metadata()) if grpc_context else {}
        outbox: asyncio.Queue = asyncio.Queue()
        try:
            session = await self.realtime_hub.open(
                bearer_token(metadata.get("authorization")),
                metadata.get(MODEL_HEADER),
                outbox.put,
                metadata.get(RESUME_HEADER),
            )
        except Refused as refused:
            if grpc_context is not None:
                grpc_context.set_code(GRPC_REFUSAL[refused.reason])
                grpc_context.set_details(str(refused))
            raise
        self.metrics.requests.inc(tags={"api": "grpc_realtime", "code": "ok"})

        async def read() -> None:
            messages = aiter(request_stream)
            try:
                while (
                    message := await self._next_client_event(session, lambda: anext(messages, None))
                ) is not None:
                    if isinstance(message, Undecodable):  # an error event; the session goes on
                        await session.handle_invalid(
                            f"event is not an omni.v1.RealtimeClientEvent: {message.reason}"
                        )
                    else:
                        await session.handle(grpc_events.client_event(message))
            finally:
                await outbox.put(None)  # the client closed its side: the session ends

        reader = asyncio.create_task(read())
        try:
            while (event := await outbox.get()) is not None:
                yield se.to_proto(event)
        finally:
            reader.cancel()
            await self.realtime_hub.close(session)

    async def Speech(
        self, request: omni_pb2.SpeechRequest, grpc_context=None
    ) -> AsyncIterator[omni_pb2.SpeechChunk]:
        """omni.v1.Omni/Speech: POST /v1/audio/speech's file, in chunks."""
        async for chunk in _grpc_status(
            self._speech(request, grpc_context), grpc_context, "gRPC speech failed"
        ):
            yield chunk

    async def _speech(self, request, grpc_context) -> AsyncIterator[omni_pb2.SpeechChunk]:
        if isinstance(request, Undecodable):
            raise request.error()
        arrival = time.perf_counter()
        metadata = dict(grpc_context.invocation_metadata()) if grpc_context else {}
        async with self._admitting("grpc_speech", "gateway.speech", metadata) as (span, tenant):
            req, turn = audio_api.grpc_speech_request(request)
            prepared = await self.pipeline.speech.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)
        file = SpeechFile(req.response_format, req.speed)
        first = True
        async for data, usage in self._speech_chunks(prepared, file, arrival, span, "grpc_speech"):
            yield omni_pb2.SpeechChunk(
                audio=data, content_type=file.content_type if first else "", usage=usage
            )
            first = False

    async def Transcribe(
        self, request: omni_pb2.TranscriptionRequest, grpc_context=None
    ) -> AsyncIterator[omni_pb2.TranscriptionChunk]:
        """omni.v1.Omni/Transcribe: a chunk per segment, then the text with usage."""
        async for chunk in _grpc_status(
            self._transcribe(request, grpc_context), grpc_context, "gRPC transcription failed"
        ):
            yield chunk

    async def _transcribe(self, request, grpc_context) -> AsyncIterator[omni_pb2.TranscriptionChunk]:
        if isinstance(request, Undecodable):
            raise request.error()
        arrival = time.perf_counter()
        metadata = dict(grpc_context.invocation_metadata()) if grpc_context else {}
        async with self._admitting("grpc_transcription", "gateway.transcription", metadata) as (span, tenant):
            turn = await asyncio.to_thread(audio_api.grpc_transcription, request, self.profile.limits)
            t = await self.pipeline.transcription.prepare(turn, tenant, "grpc_transcription")
            telemetry.inject(t.ctx)
        texts, language, duration = [], "", t.turn.audio.seconds
        async for segment in self._transcribed(t, arrival, span):
            texts.append(segment.text)
            language = segment.language
            yield omni_pb2.TranscriptionChunk(
                segment=omni_pb2.TranscriptSegment(
                    id=len(texts) - 1,
                    start=segment.start,
                    end=segment.end,
                    text=segment.text,
                    avg_logprob=segment.avg_logprob,
                    no_speech_prob=segment.no_speech_prob,
                    compression_ratio=segment.compression_ratio,
                    temperature=segment.temperature,
                ),
                language=language,
                duration=duration,
            )
        yield omni_pb2.TranscriptionChunk(
            text=" ".join(texts).strip(),
            language=language,
            duration=duration,
            usage=common_pb2.Usage(input_audio_seconds=duration),
        )

    async def ListModels(self, request: omni_pb2.ListModelsRequest) -> omni_pb2.ListModelsResponse:
        card = self._model_card()
        return omni_pb2.ListModelsResponse(
            models=[
                omni_pb2.ModelCard(
                    id=card["id"],
                    owned_by=card["owned_by"],
                    input_modalities=card["input_modalities"],
                    output_modalities=card["output_modalities"],
                )
            ]
        )

    async def Health(self, request: omni_pb2.HealthRequest) -> omni_pb2.HealthResponse:
        return omni_pb2.HealthResponse(status="ok")
