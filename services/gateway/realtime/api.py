"""OpenAI Realtime: sessions over a WebSocket (/v1/realtime), a gRPC stream (omni.v1.Omni/Realtime)
and WebRTC (/v1/realtime/calls, webrtc.py), each one RealtimeSession (services/realtime/) opened by
the replica's hub; ephemeral client secrets (auth.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response
from omni.v1 import omni_pb2

from services.common.errors import OmniError
from services.gateway.body import read_body, read_json
from services.gateway.grpc_wire import Undecodable
from services.gateway.observer import RequestObserver, bearer_token
from services.gateway.protocol import validated
from services.gateway.realtime import auth, webrtc
from services.gateway.realtime.transport import REFUSALS, Ending, Invalid, serve
from services.models.profile import Profile
from services.quota.service import QuotaService
from services.realtime import grpc_events
from services.realtime import server_events as se
from services.realtime.hub import RealtimeHub, Refused

MODEL_HEADER = "x-omniray-model"  # gRPC realtime: the model asked for (optional)
# Resume a saved realtime session (docs/realtime.md "Reconnect"): WebSocket query / gRPC metadata
RESUME_PARAM = "session_id"
RESUME_HEADER = "x-omniray-session-id"


class RealtimeAPI:
    def __init__(self, profile: Profile, hub: RealtimeHub, quota: QuotaService, observer: RequestObserver):
        self.profile, self.hub, self.quota, self.observer = profile, hub, quota, observer
        self.calls = webrtc.Calls(hub)

    async def client_secrets(self, request: Request) -> dict:
        """An ephemeral, single-use key for one realtime session of the caller's tenant (auth.py)."""
        async with self.observer.admitting("client_secrets", "gateway.client_secrets", request.headers) as (
            _,
            tenant,
        ):
            asked = validated(auth.ClientSecretRequest, await read_json(request, self.profile.limits))
            config = auth.session_settings(asked.session, self.profile)
            value, expires_at = await self.quota.mint_secret(
                tenant, asked.session, asked.expires_after.seconds
            )
        self.observer.counted("client_secrets", "ok")
        session = {**config.model_dump(), "model": config.model or self.profile.served_model_name}
        return {"value": value, "expires_at": expires_at, "session": session}

    async def call(self, request: Request) -> Response:
        """Realtime over WebRTC: an SDP offer in (with session settings, in OpenAI's form), the answer
        out (201, `Location` names the call); the session then runs on the peer connection."""
        try:
            offer, session = await webrtc.read_offer(
                await read_body(request, self.profile.limits), request.headers
            )
            if session is not None:
                auth.session_settings(session, self.profile)
            call, answer = await self.calls.answer(
                offer,
                bearer_token(request.headers.get("authorization")),
                request.query_params.get("model"),
                request.query_params.get(RESUME_PARAM),
                session,
            )
        except OmniError as e:
            self.observer.counted("webrtc", str(e.status))
            raise
        self.observer.counted("webrtc", "ok")
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"location": f"/v1/realtime/calls/{call.id}"})  # fmt: skip

    async def hang_up(self, call_id: str, request: Request) -> Response:
        """End a WebRTC call of the caller's tenant (on the replica that holds it)."""
        tenant = await self.quota.authenticate(bearer_token(request.headers.get("authorization")))
        self.calls.hang_up(call_id, tenant.id)
        return Response(status_code=200)

    async def websocket(self, ws: WebSocket) -> None:
        """OpenAI Realtime over a WebSocket: typed events in services/realtime/events.py, one
        `RealtimeSession` per connection. Refusals (key, model) are an `error` event, then close.
        A browser sends its key (or a client secret) as a subprotocol, and is answered `realtime`."""
        subprotocols = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=auth.SUBPROTOCOL if auth.SUBPROTOCOL in subprotocols else None)
        transport = _WebSocket(ws)
        try:
            session = await self.hub.open(
                bearer_token(ws.headers.get("authorization")) or auth.subprotocol_key(subprotocols),
                ws.query_params.get("model"),
                transport.send,
                ws.query_params.get(RESUME_PARAM),
            )
        except Refused as refused:
            await transport.send(refused.event)
            code, reason = REFUSALS[refused.reason].ws
            await ws.close(code=code, reason=reason)
            return
        self.observer.counted("realtime", "ok")
        try:
            await serve(session, transport)
        except WebSocketDisconnect:
            pass
        finally:
            await self.hub.close(session)

    async def grpc(
        self, request_stream: AsyncIterator[omni_pb2.RealtimeClientEvent], grpc_context=None
    ) -> AsyncIterator[omni_pb2.RealtimeServerEvent]:
        """The WebSocket's session over a bidirectional gRPC stream (Serve's proxy carries it); client
        events converted by services/realtime/grpc_events.py, server events encoded by
        services/realtime/server_events.py."""
        metadata = dict(grpc_context.invocation_metadata()) if grpc_context else {}
        transport = _GrpcStream(request_stream)
        try:
            session = await self.hub.open(
                bearer_token(metadata.get("authorization")),
                metadata.get(MODEL_HEADER),
                transport.send,
                metadata.get(RESUME_HEADER),
            )
        except Refused as refused:
            if grpc_context is not None:
                grpc_context.set_code(REFUSALS[refused.reason].grpc)
                grpc_context.set_details(str(refused))
            raise
        self.observer.counted("grpc_realtime", "ok")

        async def served() -> None:
            try:
                await serve(session, transport)
            finally:
                await transport.outbox.put(None)  # however the session ended, the stream does

        reader = asyncio.create_task(served())
        try:
            while (event := await transport.outbox.get()) is not None:
                yield grpc_events.to_proto(event)
        finally:
            reader.cancel()
            await self.hub.close(session)


class _WebSocket:
    """A session's WebSocket (Transport)."""

    CLOSE = {"idle": (1000, "idle"), "taken": (1000, "resumed elsewhere"),
             "moved": (1012, "server draining: reconnect with session_id")}  # fmt: skip  # 1012: service restart

    def __init__(self, ws: WebSocket):
        self.ws = ws

    async def receive(self) -> str | bytes | None:
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        return message.get("text") or message.get("bytes") or b""

    async def send(self, event: se.ServerEvent) -> None:
        await self.ws.send_text(se.to_json(event))

    async def close(self, ending: Ending) -> None:
        if ending in self.CLOSE:  # else the client closed it
            code, reason = self.CLOSE[ending]
            await self.ws.close(code=code, reason=reason)


class _GrpcStream:
    """A session's bidirectional gRPC stream (Transport): events out through `outbox`, None ends it."""

    def __init__(self, requests: AsyncIterator[omni_pb2.RealtimeClientEvent]):
        self.requests = aiter(requests)
        self.outbox: asyncio.Queue = asyncio.Queue()

    async def receive(self) -> dict | Invalid | None:
        message = await anext(self.requests, None)
        if isinstance(message, Undecodable):  # an error event; the session goes on
            return Invalid(f"event is not an omni.v1.RealtimeClientEvent: {message.reason}")
        return None if message is None else grpc_events.client_event(message)

    async def send(self, event: se.ServerEvent) -> None:
        await self.outbox.put(event)

    async def close(self, ending: Ending) -> None:
        await self.outbox.put(None)  # the stream ends (the client's side closed, or the session did)
