"""What a realtime session needs of its connection, whatever carries it (WebSocket, gRPC, WebRTC):
receive the client's next message, send a server event, close with a reason. One loop (`serve`)
feeds a session from any of them and owns the idle timeout; refusals map to each transport's own
answer in one table.

A message is a client event as raw text or bytes (parsed by the session), audio the transport
decoded itself (WebRTC's microphone track), or bytes it could not decode (gRPC)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal, Protocol

import grpc

from services.common.errors import internal_error
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.session import RealtimeSession

ERROR_EVERY_S = 1.0  # failing input audio is reported once a second, not at the frame rate
# Why a session's connection closes: its client left, it idled, it moved off a draining replica
# (its client reconnects with its id) or another connection resumed it.
Ending = Literal["client_left", "idle", "moved", "taken"]


@dataclass(frozen=True)
class Audio:
    pcm16: bytes  # at the session's rate (24 kHz)


@dataclass(frozen=True)
class Invalid:
    why: str  # bytes that are no client event: an `error` event, the session goes on


Message = str | bytes | dict | Audio | Invalid


class Transport(Protocol):
    async def receive(self) -> Message | None:
        """The client's next message; None once the client has gone."""
        ...

    async def send(self, event: se.ServerEvent) -> None: ...

    async def close(self, ending: Ending) -> None: ...


@dataclass(frozen=True)
class Refusal:
    """A session refused at open (services/realtime/hub.py Refused), as each transport says it."""

    http: int
    ws: tuple[int, str]  # WebSocket close code and reason
    grpc: grpc.StatusCode


REFUSALS = {
    "unauthenticated": Refusal(401, (1008, "unauthorized"), grpc.StatusCode.UNAUTHENTICATED),
    "not_found": Refusal(404, (1008, "not found"), grpc.StatusCode.NOT_FOUND),
    "limit": Refusal(429, (se.TRY_AGAIN_LATER, "try again later"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    "unavailable": Refusal(503, (se.TRY_AGAIN_LATER, "try again later"), grpc.StatusCode.UNAVAILABLE),
}


async def serve(session: RealtimeSession, transport: Transport) -> Ending:
    """The client's messages into the session, one at a time and in order, until the client goes,
    the session idles (told with an `error` event), moves or is taken over; then the transport is
    closed with the reason. Waiting while a response plays out is not idling."""
    reported_at = -float("inf")
    while True:
        message = await _next(session, transport)
        if isinstance(message, _Ended):
            await transport.close(message.ending)
            return message.ending
        if isinstance(message, Invalid):
            await session.handle_invalid(message.why)
        elif isinstance(message, Audio):
            try:
                await session.append_audio(message.pcm16)
            except Exception as e:  # reported once a second; the session goes on
                if time.monotonic() - reported_at >= ERROR_EVERY_S:
                    reported_at = time.monotonic()
                    await session.send(_audio_error(e))
        else:
            await session.handle(message)


@dataclass(frozen=True)
class _Ended:
    ending: Ending


async def _next(session: RealtimeSession, transport: Transport) -> Message | _Ended:
    """The client's next message, or why there is none."""
    idle_s = session.profile.realtime.idle_timeout_s
    # One receive for the whole wait: cancelling a stream's read half-way can break the stream.
    pending = asyncio.ensure_future(transport.receive())
    ended = session.ended  # moved, or resumed by another connection (the session's: not cancelled here)
    try:
        while True:
            done, _ = await asyncio.wait(
                {pending, ended}, timeout=idle_s, return_when=asyncio.FIRST_COMPLETED
            )
            if ended in done:
                return _Ended("moved" if session.moved else "taken")
            if done:
                message = pending.result()
                return _Ended("client_left") if message is None else message
            if not session.busy:
                await session.send(
                    se.error(
                        f"no client event for {idle_s:g} s: the session is closed", "session_idle_timeout"
                    )
                )
                return _Ended("idle")
    finally:
        pending.cancel()


def _audio_error(e: Exception) -> se.Error:
    if isinstance(e, ev.RealtimeEventError):
        return se.error(str(e), e.code)
    err = internal_error(e, "realtime input audio failed")  # our fault: logged under an id
    return se.error(err.message, err.code, kind="server_error")
