"""OpenAI Realtime: sessions over a WebSocket (/v1/realtime), a gRPC stream (omni.v1.Omni/Realtime)
and WebRTC (/v1/realtime/calls, webrtc.py), each one RealtimeSession (services/realtime/) opened by
the replica's hub; ephemeral client secrets (auth.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from fastapi import Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response
from omni.v1 import omni_pb2

from services.common.errors import OmniError
from services.gateway.body import read_body, read_json
from services.gateway.grpc_wire import Undecodable
from services.gateway.observer import RequestObserver, bearer_token
from services.gateway.protocol import validated
from services.gateway.realtime import auth, webrtc
from services.models.profile import Profile
from services.quota.service import QuotaService
from services.realtime import grpc_events
from services.realtime import server_events as se
from services.realtime.hub import RealtimeHub, Refused

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

        async def send(event: se.ServerEvent) -> None:
            await ws.send_text(se.to_json(event))

        try:
            session = await self.hub.open(
                bearer_token(ws.headers.get("authorization")) or auth.subprotocol_key(subprotocols),
                ws.query_params.get("model"),
                send,
                ws.query_params.get(RESUME_PARAM),
            )
        except Refused as refused:
            await send(refused.event)
            code, reason = WS_CLOSE[refused.reason]
            await ws.close(code=code, reason=reason)
            return
        self.observer.counted("realtime", "ok")
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
            await self.hub.close(session)

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

    async def grpc(
        self, request_stream: AsyncIterator[omni_pb2.RealtimeClientEvent], grpc_context=None
    ) -> AsyncIterator[omni_pb2.RealtimeServerEvent]:
        """The WebSocket's session over a bidirectional gRPC stream (Serve's
        proxy carries it); client events converted by services/realtime/grpc_events.py, server events
        encoded by services/realtime/server_events.py."""
        metadata = dict(grpc_context.invocation_metadata()) if grpc_context else {}
        outbox: asyncio.Queue = asyncio.Queue()
        try:
            session = await self.hub.open(
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
        self.observer.counted("grpc_realtime", "ok")

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
            await self.hub.close(session)
