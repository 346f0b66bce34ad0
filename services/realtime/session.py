"""One realtime conversation: the input audio buffer, the conversation items, and at most one
response in flight, run through the same pipeline as chat completions (encode → prefill → decode →
talker → vocoder) with the session's turns as its messages.

Transport-free: `handle` takes a raw client event and `send` (given by the WebSocket or gRPC
endpoint) takes server events as dicts. A malformed or unknown event gets an `error` event; the
session goes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import OmniError
from services.gateway import openai_api
from services.gateway.media import wav_bytes
from services.realtime import events as ev
from services.sessions.admission import AimdAdmission
from services.sessions.monitor import SessionMonitor

PCM_RATE = 24_000  # realtime audio in: pcm16 mono at 24 kHz


@dataclass
class Item:
    id: str
    role: str  # "user" (audio) or "assistant" (its transcript)
    audio: bytes = b""
    text: str = ""
    audio_ms: float = 0.0  # assistant: audio produced so far

    def message(self) -> dict:
        if self.role == "user":
            wav = base64.b64encode(wav_bytes(self.audio, PCM_RATE)).decode()
            return {
                "role": "user",
                "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}],
            }
        return {"role": "assistant", "content": self.text}


@dataclass
class Response:
    id: str
    item: Item
    task: asyncio.Task | None = None
    status: str = "in_progress"
    usage: dict = field(default_factory=dict)


class RealtimeSession:
    def __init__(
        self,
        pipeline,
        profile,
        tenant,
        session_id: str,
        send: Callable[[dict], Awaitable[None]],
        monitor: SessionMonitor,
        admission: AimdAdmission,
    ):
        self.pipeline, self.profile, self.tenant, self.monitor = pipeline, profile, tenant, monitor
        self.admission = admission
        self.id = session_id
        self.send = send
        self.config = ev.SessionConfig()
        self.buffer = bytearray()
        self.items: list[Item] = []
        self.response: Response | None = None

    # ---- events ---------------------------------------------------------------------------------

    def describe(self) -> dict:
        return {"id": self.id, "object": "realtime.session", "model": self.profile.served_model_name,
                **self.config.model_dump(exclude_none=True)}  # fmt: skip

    async def start(self) -> None:
        self.monitor.open(self.id)
        await self.send(ev.server_event("session.created", session=self.describe()))

    async def handle(self, raw: str | bytes) -> None:
        try:
            event = ev.parse_client_event(raw)
            await self._dispatch(event)
        except ev.RealtimeEventError as e:
            await self.send(ev.error_event(str(e), e.code, e.event_id))

    async def _dispatch(self, event: Any) -> None:
        if isinstance(event, ev.SessionUpdate):
            self.config = event.session
            await self.send(ev.server_event("session.updated", session=self.describe()))
        elif isinstance(event, ev.InputAudioBufferAppend):
            limit = int(self.profile.limits.max_audio_seconds * PCM_RATE * 2)
            chunk = event.pcm16()
            if len(self.buffer) + len(chunk) > limit:
                raise ev.RealtimeEventError(
                    f"input audio buffer would exceed {self.profile.limits.max_audio_seconds} s",
                    code="input_audio_buffer_full",
                    event_id=event.event_id,
                )
            self.buffer += chunk
        elif isinstance(event, ev.InputAudioBufferCommit):
            await self._commit(event)
        elif isinstance(event, ev.InputAudioBufferClear):
            self.buffer.clear()
            await self.send(ev.server_event("input_audio_buffer.cleared"))
        elif isinstance(event, ev.ResponseCreate):
            await self._create_response(event)
        elif isinstance(event, ev.ResponseCancel):
            await self.cancel()
        elif isinstance(event, ev.ConversationItemTruncate):
            await self._truncate(event)
        elif isinstance(event, ev.PlaybackProgress):
            current = self.response.item.id if self.response else None
            if event.item_id != current:
                raise ev.RealtimeEventError(
                    f"playback progress for {event.item_id!r}, not the current response's item",
                    code="item_not_found",
                    event_id=event.event_id,
                )
            self.monitor.played(self.id, event.played_ms)

    async def _commit(self, event: ev.InputAudioBufferCommit) -> None:
        if len(self.buffer) < PCM_RATE * 2 // 10:  # OpenAI's rule: at least 100 ms
            raise ev.RealtimeEventError(
                f"input audio buffer holds {len(self.buffer) / (PCM_RATE * 2) * 1000:.0f} ms; commit needs 100 ms",
                code="input_audio_buffer_commit_empty",
                event_id=event.event_id,
            )
        previous = self.items[-1].id if self.items else None
        item = Item(ev.new_id("item"), "user", audio=bytes(self.buffer))
        self.buffer.clear()
        self.items.append(item)
        await self.send(
            ev.server_event("input_audio_buffer.committed", item_id=item.id, previous_item_id=previous)
        )
        await self.send(
            ev.server_event(
                "conversation.item.added",
                previous_item_id=previous,
                item={
                    "id": item.id,
                    "type": "message",
                    "object": "realtime.item",
                    "role": "user",
                    "status": "completed",
                    "content": [{"type": "input_audio", "transcript": None}],
                },
            )  # fmt: skip
        )

    # ---- responses ------------------------------------------------------------------------------

    def _chat_body(self, config: ev.ResponseConfig) -> dict:
        modalities = config.output_modalities or self.config.output_modalities
        instructions = config.instructions or self.config.instructions
        limit = config.max_output_tokens or self.config.max_output_tokens
        messages = ([{"role": "system", "content": instructions}] if instructions else []) + [
            item.message() for item in self.items if item.role == "user" or item.text
        ]
        body: dict[str, Any] = {"model": self.profile.served_model_name, "messages": messages}
        if "audio" in modalities:
            voice = self.config.audio.output.voice or self.profile.pipeline.default_voice
            body["modalities"] = ["text", "audio"]
            body["audio"] = {"voice": voice, "format": "pcm16"}
        if isinstance(limit, int):
            body["max_tokens"] = limit
        return body

    async def _create_response(self, event: ev.ResponseCreate) -> None:
        if self.response is not None and self.response.status == "in_progress":
            raise ev.RealtimeEventError(
                "a response is already in progress; cancel it first",
                code="conversation_already_has_active_response",
                event_id=event.event_id,
            )
        if not any(item.role == "user" for item in self.items):
            raise ev.RealtimeEventError(
                "nothing to respond to: commit some input audio first", event_id=event.event_id
            )
        try:
            _, proto = openai_api.parse_request(self._chat_body(event.response), self.profile.limits)
            proto.session_id = self.id
            prepared = await self.pipeline.prepare(proto, self.tenant)
        except OmniError as e:
            err = e.body()["error"]
            await self.send(
                ev.error_event(err["message"], err.get("code") or "invalid_request", event.event_id)
            )
            return
        response = Response(ev.new_id("resp"), Item(ev.new_id("item"), "assistant"))
        self.response = response
        await self.send(ev.server_event("response.created", response=self._describe(response)))
        response.task = asyncio.create_task(self._run(response, prepared))

    def _describe(self, r: Response) -> dict:
        item = {"id": r.item.id, "type": "message", "object": "realtime.item", "role": "assistant",
                "status": "completed" if r.status == "completed" else "incomplete",
                "content": [{"type": "output_audio", "transcript": r.item.text}]}  # fmt: skip
        return {"id": r.id, "object": "realtime.response", "status": r.status,
                "output": [item] if r.status != "in_progress" else [], "usage": r.usage or None}  # fmt: skip

    async def _run(self, r: Response, prepared) -> None:
        ids = {"response_id": r.id, "item_id": r.item.id, "output_index": 0, "content_index": 0}
        self.items.append(r.item)
        self.monitor.response_started(self.id)
        last: tuple[float, float] | None = None  # (sent at, audio seconds) of the previous delta
        try:
            async for out in self.pipeline.generate(prepared):
                if out.text:
                    r.item.text += out.text
                    await self.send(
                        ev.server_event("response.output_audio_transcript.delta", delta=out.text, **ids)
                    )
                if out.pcm16:
                    ms = len(out.pcm16) / 2 / (out.sample_rate or PCM_RATE) * 1000
                    r.item.audio_ms += ms
                    self.monitor.audio_sent(self.id, ms)
                    now = time.monotonic()
                    if last is not None:  # frame lateness: delivery interval over the audio it follows
                        self.admission.observe((now - last[0]) / max(last[1], 1e-3))
                    last = (now, ms / 1000)
                    delta = base64.b64encode(out.pcm16).decode()
                    await self.send(ev.server_event("response.output_audio.delta", delta=delta, **ids))
                if out.finish_reason and out.usage is not None:
                    r.usage = {"input_tokens": out.usage.prompt_tokens, "output_tokens": out.usage.completion_tokens,
                               "total_tokens": out.usage.total_tokens}  # fmt: skip
            r.status = "completed"
            await self.send(ev.server_event("response.output_audio.done", **ids))
            await self.send(
                ev.server_event("response.output_audio_transcript.done", transcript=r.item.text, **ids)
            )
        except asyncio.CancelledError:
            r.status = "cancelled"
        except Exception as e:  # the stage failed: say so, keep the session
            r.status = "failed"
            await self.send(ev.error_event(f"response failed: {e}", "response_failed", kind="server_error"))
        finally:
            self.monitor.response_finished(self.id)
            await self.send(ev.server_event("response.done", response=self._describe(r)))

    async def cancel(self) -> None:
        r = self.response
        if r is None or r.task is None or r.task.done():
            return
        r.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await r.task

    async def _truncate(self, event: ev.ConversationItemTruncate) -> None:
        """The client played only `audio_end_ms` of an assistant item: the conversation keeps the part
        of its transcript spoken by then (in proportion to the audio, cut at a word boundary)."""
        item = next((i for i in self.items if i.id == event.item_id and i.role == "assistant"), None)
        if item is None:
            raise ev.RealtimeEventError(
                f"no assistant item {event.item_id!r}", code="item_not_found", event_id=event.event_id
            )
        if event.audio_end_ms > item.audio_ms + 1:
            raise ev.RealtimeEventError(
                f"audio_end_ms {event.audio_end_ms} is past the item's audio ({item.audio_ms:.0f} ms)",
                event_id=event.event_id,
            )
        if item.audio_ms:
            keep = int(len(item.text) * min(1.0, event.audio_end_ms / item.audio_ms))
            cut = item.text.rfind(" ", 0, keep + 1) if keep < len(item.text) else keep
            item.text = item.text[: max(cut, 0)]
            item.audio_ms = float(event.audio_end_ms)
        if self.response is not None and self.response.item is item:
            self.monitor.truncated(self.id, event.audio_end_ms)
        await self.send(
            ev.server_event(
                "conversation.item.truncated",
                item_id=item.id,
                content_index=0,
                audio_end_ms=event.audio_end_ms,
            )
        )

    async def close(self) -> None:
        await self.cancel()
        self.monitor.close(self.id)
