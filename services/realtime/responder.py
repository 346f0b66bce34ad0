"""A realtime response's events in OpenAI's order (response.created ... response.done), built from
the pipeline's events: its message item and content part, text or audio deltas with their
transcript, each function call as its own item, the usage; and a barge-in's cut of what was
played."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from services.common.errors import OmniError, internal_error
from services.pipeline.tools import ToolCall
from services.playback.monitor import PlaybackMonitor
from services.policies.admission import AimdAdmission
from services.quota.tenants import TenantSpec
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.codecs import PCM_RATE, OutputAudio
from services.realtime.conversation import Conversation
from services.realtime.items import Item, Response
from services.realtime.stats import RealtimeStats


class SessionSide(Protocol):
    """What a response needs of its session."""

    id: str
    key: str
    tenant: TenantSpec
    audio_track: bool  # its transport plays the audio itself: pcm16, whatever the output format

    async def send(self, event: se.ServerEvent) -> None: ...

    async def spend_audio(self, seconds: float, event_id: str | None) -> None: ...

    async def turn_done(self) -> None: ...


class Responder:
    """The session's responses: at most one in flight (`response`, the last one)."""

    def __init__(
        self,
        session: SessionSide,
        pipeline,
        conversation: Conversation,
        monitor: PlaybackMonitor,
        admission: AimdAdmission,
        stats: RealtimeStats,
    ):
        self.session, self.pipeline, self.conversation = session, pipeline, conversation
        self.key, self.send = session.key, session.send
        self.monitor, self.admission, self.stats = monitor, admission, stats
        self.response: Response | None = None

    @property
    def busy(self) -> bool:
        return self.response is not None and self.response.status == "in_progress"

    async def _input_items(
        self, config: ev.ResponseConfig, event_id: str | None, session: ev.SessionConfig
    ) -> list[Item] | None:
        """A response's own `input` (None: the conversation): references to conversation items, or
        new items that stay out of the conversation."""
        if config.input is None:
            return None
        items = []
        for given in config.input:
            if given.type == "item_reference":
                items.append(self.conversation.find(given.id or "", event_id))
                continue
            item = self.conversation.parse(given, event_id, session.audio.input.format.type)
            if item.clips:
                await self.session.spend_audio(item.seconds, event_id)
            items.append(item)
        return items

    async def create(self, event: ev.ResponseCreate, session: ev.SessionConfig) -> None:
        """A response from the conversation (or the response's own `input`), with no new input
        needed: a bot may speak first from its instructions."""
        if self.busy:
            raise ev.RealtimeEventError(
                "a response is already in progress; cancel it first",
                code="conversation_already_has_active_response",
                event_id=event.event_id,
            )
        config = event.response
        items = await self._input_items(config, event.event_id, session)
        while True:
            try:
                turn, turns = self.conversation.request(session, self.session.id, config, items=items)
            except ev.RealtimeEventError as e:
                e.event_id = event.event_id
                raise
            try:
                prepared = await self.pipeline.prepare(turn, self.session.tenant)
                break
            except OmniError as e:
                if e.code == "context_length_exceeded" and items is None and len(turns) > 1:
                    # The window's token estimate fell short (a turn not measured yet, new
                    # instructions): one turn less, and again. Each pass drops a turn, so it ends.
                    self.conversation.drop_turns(1)
                    continue
                err = e.body()["error"]
                await self.send(
                    se.error(err["message"], err.get("code") or "invalid_request", event.event_id)
                )
                return
        if items is None:
            self.conversation.measure(turns, prepared)
        modalities = list(config.output_modalities or session.output_modalities)
        item = Item(se.new_id("item"), "assistant", audio_out="audio" in modalities)
        response = Response(
            se.new_id("resp"), item, modalities, config.conversation == "auto", config.metadata
        )
        response.audio_in_tokens = sum(user.audio_tokens or 0 for turn in turns for user in turn[:1])
        if turn.tools is not None and turn.tools.choice != "none":
            response.tools = turn.tools
        self.response = response
        await self.send(se.ResponseCreated(response=self.describe(response)))
        if buckets := prepared.lease.buckets:  # what the tenant has left after admitting it
            limits = [se.RateLimit(name="tokens" if b.modality == "text_tokens" else b.modality, limit=b.limit,
                                   remaining=round(max(0.0, b.remaining), 3), reset_seconds=round(b.reset_s, 3))
                      for b in buckets]  # fmt: skip
            await self.send(se.RateLimitsUpdated(rate_limits=limits))
        response.task = asyncio.create_task(
            self.run(
                response,
                prepared,
                "audio/pcm" if self.session.audio_track else session.audio.output.format.type,
            )
        )

    async def cancel(self) -> None:
        r = self.response
        if r is None or r.task is None or r.task.done():
            return
        r.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await r.task

    def describe(self, r: Response) -> se.Response:
        done = r.status != "in_progress"
        return se.Response(
            id=r.id,
            status=r.status,
            status_details=r.details,
            conversation_id=self.conversation.id if r.in_conversation else None,
            output_modalities=r.modalities,
            output=[i.describe(r.item_status) for i in r.output] if done else [],
            usage=r.usage if done else None,
            metadata=r.metadata,
        )

    def _observe_frame(self, frame_ms: float) -> None:
        """Admission's signal (Metronome): the decode engine's frame time over the audio a token
        yields — above 1 the engine cannot keep its sessions' speech real-time, whatever the
        buffers hold; a paced (held) response does not read as late, as delivery intervals would."""
        if ms_per_token := self.monitor.ms_per_token(self.key):
            self.admission.observe(frame_ms / ms_per_token)

    async def run(self, r: Response, prepared, output_format: str) -> None:
        """The response's events in OpenAI's order: its message item and content part added, the
        deltas, the part and item done (also when cancelled or failed: incomplete); each function
        call the answer makes as its own item (added when it begins, its arguments' deltas, then the
        arguments and item done after the message's); then `response.done`. With tools offered the
        message begins at its first content (an answer that is only calls has no empty message); it
        stays open after a call begins, for the audio of the words before it. Calls are never
        spoken."""
        ids = {"response_id": r.id, "item_id": r.item.id}
        if r.tools is None:
            await self._begin_message(r)
        calls: dict[int, Item] = {}  # the answer's calls by index
        audio_out = OutputAudio(output_format)
        self.monitor.response_started(self.key)
        finish = None
        try:
            async for out in self.pipeline.generate(prepared):
                if out.frame_ms > 0 and r.item.audio_out:
                    self._observe_frame(out.frame_ms)
                if r.message == "none" and (out.text or out.pcm16):
                    await self._begin_message(r)
                if out.text:
                    r.item.text += out.text
                    r.item.generated += out.text
                    if r.item.audio_out:
                        await self.send(se.ResponseOutputAudioTranscriptDelta(delta=out.text, **ids))
                    else:
                        await self.send(se.ResponseOutputTextDelta(delta=out.text, **ids))
                await self._call_pieces(r, calls, out.calls)
                # the event's tokens wrote its last piece: a call's, else the message's
                (calls[out.calls[-1].index] if out.calls else r.item).tokens += out.tokens
                if out.pcm16 and r.message == "open":
                    await self._audio(r, out, audio_out)
                if out.finish_reason and out.usage is not None:
                    finish, r.usage = out.finish_reason, self._usage(out.usage, r)
            if finish == "length":  # the response's (or session's) max_output_tokens, or the profile's
                r.status = "incomplete"
                r.details = se.StatusDetails(type="incomplete", reason="max_output_tokens")
            else:
                r.status = "completed"
                r.details = se.StatusDetails(type="completed")
            if not r.output:  # an empty answer is an empty message
                await self._begin_message(r)
            if r.message == "open":
                await self._message_written(r, audio_out)
        except asyncio.CancelledError:
            self._cancelled(r)
        except Exception as e:  # the stage failed: say so, keep the session
            await self._failed(r, e)
        finally:
            tokens = r.item.tokens + sum(c.tokens for c in calls.values())
            self.stats.generated(tokens)
            if r.whole and not calls:  # whole responses tell the audio per token
                self.monitor.response_finished(self.key, r.item.tokens, r.item.audio_ms)
            else:
                self.monitor.response_finished(self.key)
            self._streamed_usage(r, tokens)
            if r.message == "open":
                await self._end_message(r)
            for item in calls.values():
                await self._call_done(r, item)
            await self.send(se.ResponseDone(response=self.describe(r)))
            await self.session.turn_done()

    async def _call_pieces(self, r: Response, calls: dict[int, Item], pieces) -> None:
        """Calls as the answer writes them: each added when it begins, its arguments' deltas."""
        for d in pieces:
            if d.index not in calls:
                calls[d.index] = await self._add_call(r, ToolCall(d.id, d.name, ""))
            item = calls[d.index]
            item.text += d.arguments
            if d.arguments:
                await self.send(se.FunctionCallArgumentsDelta(
                    response_id=r.id, item_id=item.id, output_index=r.output.index(item),
                    call_id=item.call_id, delta=d.arguments))  # fmt: skip

    async def _audio(self, r: Response, out, audio_out: OutputAudio) -> None:
        """A piece of the message's audio: counted against the piece of text it speaks, sent."""
        ms = len(out.pcm16) / 2 / (out.sample_rate or PCM_RATE) * 1000
        if out.transcript is not None or not r.item.spoken:  # a new spoken piece
            r.item.spoken.append([out.transcript or "", 0.0])
        r.item.spoken[-1][1] += ms
        self.monitor.audio_sent(self.key, ms)
        if delta := audio_out.encode(out.pcm16):
            await self.send(se.ResponseOutputAudioDelta(delta=delta, response_id=r.id, item_id=r.item.id))

    async def _call_done(self, r: Response, item: Item) -> None:
        """A call's arguments and item done, after the message's."""
        item.generated = item.text
        index = r.output.index(item)
        await self.send(se.FunctionCallArgumentsDone(response_id=r.id, item_id=item.id, output_index=index,
                                                     call_id=item.call_id, name=item.name,
                                                     arguments=item.text))  # fmt: skip
        done = item.describe(r.item_status)
        await self.send(se.ResponseOutputItemDone(response_id=r.id, output_index=index, item=done))
        if r.in_conversation:
            await self.send(se.ConversationItemDone(item=done))

    async def _begin_message(self, r: Response) -> None:
        """The response's message item added (to the conversation too, in band), its part begun."""
        r.output.append(r.item)
        r.message = "open"
        index = len(r.output) - 1
        await self.send(
            se.ResponseOutputItemAdded(
                response_id=r.id, output_index=index, item=r.item.describe("in_progress")
            )
        )
        if r.in_conversation:
            r.previous = self.conversation.last_id
            self.conversation.items.append(r.item)
            await self.send(
                se.ConversationItemAdded(previous_item_id=r.previous, item=r.item.describe("in_progress"))
            )
        await self.send(
            se.ResponseContentPartAdded(
                part=r.item.part(), response_id=r.id, item_id=r.item.id, output_index=index
            )
        )

    async def _message_written(self, r: Response, audio_out: OutputAudio) -> None:
        """The message's content is whole: its audio and transcript (or text) done."""
        ids = {"response_id": r.id, "item_id": r.item.id, "output_index": r.output.index(r.item)}
        if r.item.audio_out:
            if delta := audio_out.flush():
                await self.send(se.ResponseOutputAudioDelta(delta=delta, **ids))
            await self.send(se.ResponseOutputAudioDone(**ids))
            await self.send(se.ResponseOutputAudioTranscriptDone(transcript=r.item.text, **ids))
        else:
            await self.send(se.ResponseOutputTextDone(text=r.item.text, **ids))

    async def _end_message(self, r: Response) -> None:
        """The message's part and item done (incomplete unless the response completed, or a call
        followed it)."""
        r.message = "done"
        index = r.output.index(r.item)
        status = "completed" if r.status == "in_progress" else r.item_status
        done = r.item.describe(status)
        await self.send(
            se.ResponseContentPartDone(
                part=r.item.part(), response_id=r.id, item_id=r.item.id, output_index=index
            )
        )
        await self.send(se.ResponseOutputItemDone(response_id=r.id, output_index=index, item=done))
        if r.in_conversation:
            await self.send(se.ConversationItemDone(previous_item_id=r.previous, item=done))

    @staticmethod
    def _streamed_usage(r: Response, tokens: int) -> None:
        """A response that ended before the engine's count (cancelled, failed): what was streamed."""
        if not r.usage.output_tokens:
            r.usage = se.Usage(output_tokens=tokens, total_tokens=tokens,
                               output_token_details=se.TokenDetails(text_tokens=tokens))  # fmt: skip

    @staticmethod
    def _cancelled(r: Response) -> None:
        r.status = "cancelled"
        r.details = se.StatusDetails(type="cancelled", reason=r.cancel_reason)

    async def _failed(self, r: Response, e: Exception) -> None:
        """A stage failed the response: `failed` with the error's code, told in an `error` event
        (without exception text); the session goes on."""
        r.status = "failed"
        err = (
            e
            if isinstance(e, OmniError)
            else internal_error(e, f"realtime session {self.key}: response failed")
        )
        code = err.code or "response_failed"
        r.details = se.StatusDetails(type="failed", error={"type": "server_error", "code": code})
        await self.send(se.error(err.message, code, kind="server_error"))

    async def _add_call(self, r: Response, call: ToolCall) -> Item:
        """One of the response's function_call items, added (to the conversation too, in band)."""
        item = Item(se.new_id("item"), "assistant", text=call.arguments, kind="function_call",
                    call_id=call.id, name=call.name)  # fmt: skip
        r.output.append(item)
        index = len(r.output) - 1
        await self.send(
            se.ResponseOutputItemAdded(
                response_id=r.id, output_index=index, item=item.describe("in_progress")
            )
        )
        if r.in_conversation:
            previous = self.conversation.last_id
            self.conversation.items.append(item)
            await self.send(
                se.ConversationItemAdded(previous_item_id=previous, item=item.describe("in_progress"))
            )
        return item

    @staticmethod
    def _usage(u, r: Response) -> se.Usage:
        """OpenAI's usage with its details: the prompt's audio tokens are its user audio's rows."""
        audio = min(r.audio_in_tokens, u.prompt_tokens)
        return se.Usage(
            input_tokens=u.prompt_tokens,
            output_tokens=u.completion_tokens,
            total_tokens=u.total_tokens,
            input_token_details=se.InputTokenDetails(
                text_tokens=u.prompt_tokens - audio, audio_tokens=audio, cached_tokens=u.cached_prompt_tokens
            ),
            output_token_details=se.TokenDetails(text_tokens=u.completion_tokens),
        )

    async def cut_to_played(self, r: Response) -> None:
        view = self.monitor.snapshot().get(self.key)
        played = min(view.played_ms if view else 0.0, r.item.audio_ms)
        if played >= r.item.audio_ms and r.whole:
            return  # all of it was heard
        r.item.cut(played)
        generated = max(len(r.item.generated), 1)
        wasted = r.item.tokens - round(r.item.tokens * len(r.item.text) / generated)
        self.monitor.truncated(self.key, played)
        self.stats.barge_in(wasted)
        await self.send(
            se.ConversationItemTruncated(
                item_id=r.item.id,
                audio_end_ms=int(played),
                omniray=se.TruncationCost(wasted_tokens=wasted, generated_tokens=r.item.tokens),
            )
        )
