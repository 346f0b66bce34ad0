"""One realtime conversation: the client's events dispatched to the session's parts, each in its
own module — the input (buffer, server VAD, clips, speculative prefill: input.py), the conversation
(its items and window: conversation.py), the response in flight (its event order: responder.py),
continuity (save and restore: continuity.py) and the session's lifecycle (lifecycle.py). At most one
response is in flight, run through the same pipeline as chat completions with the session's turns as
its messages; the pipeline and the quota are all it reaches outside.

Transport-free: `handle` takes a raw client event and `send` (given by the WebSocket, gRPC or WebRTC
endpoint) takes typed server events (services/realtime/server_events.py). A malformed or unknown
event gets an `error` event; the session goes on. A user turn is its audio as decoded clips
(services/pipeline/turn.py), each resampled, hashed and encoded once — a response sends the pipeline
the session's items as they are, so a turn costs the audio it adds, not the whole history again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from services.common.errors import OmniError, internal_error
from services.common.session_key import SessionKey
from services.pipeline.turn import AudioClip
from services.playback.monitor import PlaybackMonitor
from services.policies.admission import AimdAdmission
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.camera import Camera
from services.realtime.codecs import PCM_RATE, InputAudio
from services.realtime.continuity import SavedState, SessionSaver, SessionStore
from services.realtime.conversation import Conversation, max_output_of
from services.realtime.input import MIN_TURN_BYTES, InputBuffer
from services.realtime.items import Item, Response
from services.realtime.lifecycle import Lifecycle, Phase
from services.realtime.responder import Responder
from services.realtime.settings import refusals
from services.realtime.stats import RealtimeStats
from services.realtime.transcript import transcribe_turn

log = logging.getLogger(__name__)
# Client events after which the session is saved for a reconnect (a turn boundary of the client's)
SAVED_AFTER = (
    ev.SessionUpdate,
    ev.ConversationItemCreate,
    ev.ConversationItemDelete,
    ev.ConversationItemTruncate,
)


class RealtimeSession:
    def __init__(
        self,
        pipeline,
        profile,
        tenant,
        session_id: str,
        send: Callable[[se.ServerEvent], Awaitable[None]],
        monitor: PlaybackMonitor,
        admission: AimdAdmission,
        stats: RealtimeStats,
        continuity: tuple[SessionStore, str] | None = None,
        audio_track: bool = False,
    ):
        self.pipeline, self.profile, self.tenant, self.monitor = pipeline, profile, tenant, monitor
        self.admission, self.stats = admission, stats
        self.id = session_id
        # The pipeline scopes session ids by tenant; the monitor (and the board the engines read)
        # uses that same key, so a request's session names its board entry.
        self.key = str(SessionKey(tenant.id, session_id))
        self.send = send
        self.config = ev.SessionConfig()
        self.life = Lifecycle()
        self.input = InputBuffer(profile, self.config.audio.input.format.type)
        self.camera = Camera(profile)
        self.conversation = Conversation(profile, stats)
        # A transport with its own audio track (WebRTC) takes the responses' audio as pcm16.
        self.audio_track = audio_track
        self.responder = Responder(self, pipeline, self.conversation, monitor, admission, stats)
        self.next_item_id = se.new_id("item")  # the user item speech will become
        self.transcribing: set[asyncio.Task] = set()  # input transcriptions beside the responses
        # Saved for a reconnect (services/realtime/continuity.py), by this connection's owner token.
        self.saver = None
        if continuity is not None:
            store, owner = continuity
            self.saver = SessionSaver(store, owner, SessionKey(tenant.id, session_id), stats, self.taken_over)
        self.input.start_vad(self.config.audio.input.turn_detection)

    # ---- lifecycle (lifecycle.py) -------------------------------------------------------------

    @property
    def ended(self) -> asyncio.Future:
        """Done when the transport should stop: the session moved or was taken over."""
        return self.life.ended

    @property
    def moved(self) -> bool:
        return Phase.MOVED in self.life.handed_off

    @property
    def taken(self) -> bool:
        return Phase.TAKEN in self.life.handed_off

    def describe(self) -> se.Session:
        # what the server says of itself wins over what a client put beside its settings
        settings = {k: v for k, v in self.config.model_dump().items() if k not in ("id", "object", "model")}
        return se.Session(id=self.id, model=self.profile.served_model_name, **settings)

    async def start(self, resumed: bool = False, settings: dict | None = None) -> None:
        """Say the session is open; `settings`: what it starts with (a client secret's)."""
        self.monitor.open(self.key)
        if settings:
            await self._configure(settings, None)
        await self.send(se.SessionCreated(session=self.describe()))
        if resumed:
            items = [i.describe() for i in self.conversation.items]
            await self.send(se.SessionResumed(session_id=self.id, items=items))
        self._save_soon()  # a session resumable from its start (its settings)

    def restore(self, state: SavedState, clips: dict[str, np.ndarray]) -> None:
        """The saved session, before `start`: settings, conversation, prompt measurements."""
        self.config = ev.SessionConfig.model_validate(state.config)
        self.input.audio = InputAudio(self.config.audio.input.format.type)
        c = self.conversation
        c.id, c.head_tokens, c.turn_overhead, c.audio_rate = (
            state.conversation_id, state.head_tokens, state.turn_overhead, state.audio_rate
        )  # fmt: skip
        c.items = []
        for saved in state.items:
            fields = saved.model_dump(exclude={"clips"})
            samples = [clips[name] for name in saved.clips]
            item_clips = [AudioClip(rate=PCM_RATE, frames=len(x), samples=x, keep=True) for x in samples]
            c.items.append(Item(**fields, clips=item_clips))
        if self.saver is not None:
            self.saver.saved_clips = {name for saved in state.items for name in saved.clips}
        self.input.start_vad(self.config.audio.input.turn_detection)

    @property
    def _resumable(self) -> bool:
        """Saved for a reconnect, and still this connection's to save."""
        return self.saver is not None and not self.saver.stopped

    def _save_soon(self) -> None:
        """Save the session at a turn boundary (continuity.py)."""
        if self.saver is not None and self.life.phase is not Phase.CLOSED:
            self.saver.soon(self._snapshot)

    def _snapshot(self) -> tuple[SavedState, list[Item]]:
        c = self.conversation
        state = SavedState(config=self.config.model_dump(), conversation_id=c.id, items=[],
                           head_tokens=c.head_tokens, turn_overhead=c.turn_overhead, audio_rate=c.audio_rate)  # fmt: skip
        return state, list(c.items)

    async def migrate(self) -> None:
        """This gateway replica drains: the session moves at its next turn boundary — now when no
        response is in flight, else when the response is done. Without continuity (off, or its
        store unreachable at open) it cannot move and goes on until the replica stops."""
        if not self._resumable or self.life.phase is Phase.CLOSED:
            return
        self.life.to(Phase.MIGRATING)
        if not self.busy:
            await self._hand_over()

    async def _hand_over(self) -> None:
        """Save the conversation as it is, tell the client to reconnect with its id, end here."""
        if self.life.phase is Phase.CLOSED or self.ended.done() or not self._resumable:
            return
        self._save_soon()
        await self.saver.saved()
        with contextlib.suppress(Exception):
            await self.send(se.SessionMigrate(session_id=self.id))
        self.life.to(Phase.MOVED)
        self.stats.migrations.inc()

    async def taken_over(self) -> None:
        """Another connection resumed this session: say so and end this one."""
        self.life.to(Phase.TAKEN)
        if self.saver is not None:
            self.saver.stopped = True  # the record is the new connection's
        with contextlib.suppress(Exception):
            await self.send(se.error("this session was resumed by another connection", "session_taken_over"))

    async def turn_done(self) -> None:
        """After each response: a turn boundary (saved; a draining replica's session moves here)."""
        self._save_soon()
        if self.life.phase is Phase.MIGRATING:
            await self._hand_over()

    # ---- input (input.py) ---------------------------------------------------------------------

    async def append_audio(self, pcm16: bytes, event_id: str | None = None) -> None:
        """User audio (pcm16 at 24 kHz) into the input buffer, through server VAD when it is on:
        a client's `input_audio_buffer.append`, or a transport's own audio track (WebRTC)."""
        self.input.append(pcm16, event_id)
        if self.input.vad is not None:
            for found in await self.input.detect(pcm16):
                if found.kind == "speech_started":
                    await self._speech_started(found.audio_ms)
                else:
                    await self._speech_stopped(found.audio_ms)
            self.input.forget_silence()
            self._prefill_ahead()

    async def _speech_started(self, audio_start_ms: int) -> None:
        """The user talks. Over a response (barge-in) the response stops before anything else is
        sent — no audio delta follows `speech_started` — and the assistant's item is cut to what
        the client played."""
        td = self.config.audio.input.turn_detection
        self.input.speech_started_at(audio_start_ms)
        barge = self.monitor.speech_started(self.key)
        r = self.response
        running = r is not None and r.task is not None and not r.task.done()
        if running and td.interrupt_response:
            r.cancel_reason = "turn_detected"
            r.task.cancel()
        await self.send(
            se.InputAudioBufferSpeechStarted(audio_start_ms=audio_start_ms, item_id=self.next_item_id)
        )
        if running and td.interrupt_response:
            with contextlib.suppress(asyncio.CancelledError):
                await r.task
        if barge and r is not None and (td.interrupt_response or not running):
            await self.responder.cut_to_played(r)

    async def _speech_stopped(self, audio_end_ms: int) -> None:
        td = self.config.audio.input.turn_detection
        self.monitor.speech_stopped(self.key)
        item_id, started = self.next_item_id, self.input.speech_start_ms is not None
        await self.send(se.InputAudioBufferSpeechStopped(audio_end_ms=audio_end_ms, item_id=item_id))
        if started:  # what came before the speech (and its padding) is not the turn
            self.input.drop(self.input.speech_offset())
        self.input.speech_started_at(None)
        end = self.input.offset(audio_end_ms)  # nor is the silence after it
        if end < MIN_TURN_BYTES:
            return  # a blip: nothing worth a turn (dropped with the silence around it)
        await self._commit(None, end)
        if td.create_response and (self.response is None or self.response.status != "in_progress"):
            await self.responder.create(ev.ResponseCreate(type="response.create"), self.config)

    async def _commit(self, event: ev.InputAudioBufferCommit | None, upto: int | None = None) -> None:
        """The buffer's first `upto` bytes (all by default) become a user item."""
        upto = len(self.input.buffer) if upto is None else upto
        event_id = event.event_id if event else None
        if upto < MIN_TURN_BYTES:
            raise ev.RealtimeEventError(
                f"input audio buffer holds {upto / (PCM_RATE * 2) * 1000:.0f} ms; commit needs 100 ms",
                code="input_audio_buffer_commit_empty",
                event_id=event_id,
            )
        # The turn's audio is debited before it is kept (less what speculative prefill paid for).
        seconds = upto / (PCM_RATE * 2)
        try:
            await self.pipeline.quota.spend_session_audio(
                self.tenant, self.id, max(0.0, seconds - self.input.ahead_paid_s)
            )
        except OmniError as e:
            self.input.drop()
            self.input.speech_started_at(None)
            raise ev.RealtimeEventError(
                e.message, code=e.code or "rate_limit_exceeded", event_id=event_id
            ) from None
        previous = self.conversation.last_id
        item = Item(self.next_item_id, "user", clips=self.input.take_turn(upto), frames=self.camera.take())
        self.next_item_id = se.new_id("item")
        self.conversation.items.append(item)
        self._save_soon()
        await self.send(se.InputAudioBufferCommitted(item_id=item.id, previous_item_id=previous))
        await self.send(se.ConversationItemAdded(previous_item_id=previous, item=item.describe()))
        await self.send(se.ConversationItemDone(previous_item_id=previous, item=item.describe()))
        if (asked := self.config.audio.input.transcription) is not None:
            task = asyncio.create_task(transcribe_turn(self, self.pipeline, item, asked))
            self.transcribing.add(task)
            task.add_done_callback(self.transcribing.discard)

    def _prefill_ahead(self) -> None:
        """While the user speaks, prefill the conversation up to the audio chunks completed so far,
        one request at a time (the session's `omniray.speculative_prefill`, default on), so that at
        the end of the turn only its last chunk (and what the next chunk adds while one is in
        flight) remains to prefill."""
        if not self.config.omniray.speculative_prefill:
            return
        if (clips := self.input.ahead_due()) is not None:
            self.input.ahead = asyncio.create_task(self._run_ahead(Item("pending", "user", clips=clips)))

    async def _run_ahead(self, pending: Item) -> None:
        try:
            # Speculation spends the tenant's realtime audio budget as it goes (the turn's commit
            # then pays only the rest): speaking and clearing cannot buy free prefill.
            seconds = pending.seconds
            await self.pipeline.quota.spend_session_audio(
                self.tenant, self.id, seconds - self.input.ahead_paid_s
            )
            self.input.ahead_paid_s = seconds
            turn, _ = self.conversation.request(self.config, self.id, ev.ResponseConfig(), pending)
            tokens = await self.pipeline.prefill_ahead(turn, self.tenant)
            self.stats.prefilled_ahead("done", tokens)
        except asyncio.CancelledError:
            self.stats.prefilled_ahead("cancelled", 0)
            raise
        except Exception as e:  # speculation only: the turn's own request does the work then
            log.warning("session %s: speculative prefill failed: %s", self.key, e)
            self.stats.prefilled_ahead("failed", 0)

    # ---- client events ------------------------------------------------------------------------

    async def handle(self, raw: str | bytes | dict) -> None:
        """One client event. Whatever goes wrong is an `error` event and the session goes on."""
        event = None
        try:
            event = ev.parse_client_event(raw)
            await self._dispatch(event)
            if isinstance(event, SAVED_AFTER):
                self._save_soon()
        except ev.RealtimeEventError as e:
            await self.send(se.error(str(e), e.code, e.event_id))
        except OmniError as e:
            await self.send(
                se.error(e.message, e.code or "invalid_request", getattr(event, "event_id", None))
            )
        except Exception as e:
            err = internal_error(e, f"realtime session {self.key}: event failed")
            await self.send(se.error(err.message, err.code, getattr(event, "event_id", None), "server_error"))

    def played(self, item_id: str, played_ms: float) -> bool:
        """How much of the current response's audio the client has played (what the scheduler and a
        barge-in's cut go by); False when `item_id` is not the current response's item."""
        if self.response is None or self.response.item.id != item_id:
            return False
        self.monitor.played(self.key, played_ms)
        return True

    @property
    def busy(self) -> bool:
        """A response is in flight (a client may listen without sending anything meanwhile)."""
        return self.responder.busy

    @property
    def response(self) -> Response | None:
        """The last response (in flight, or done)."""
        return self.responder.response

    async def cancel(self) -> None:
        await self.responder.cancel()

    async def handle_invalid(self, why: str) -> None:
        """A client event the transport could not decode."""
        await self.send(se.error(why, "invalid_event"))

    async def _dispatch(self, event: Any) -> None:
        if isinstance(event, ev.SessionUpdate):
            await self._update_session(event)
        elif isinstance(event, ev.InputAudioBufferAppend):
            await self.append_audio(self.input.audio.decode(event.data(), event.event_id), event.event_id)
        elif isinstance(event, ev.InputImageBufferAppend):
            await self.camera.show(event.image_url, event.event_id)
        elif isinstance(event, ev.InputAudioBufferCommit):
            await self._commit(event)
        elif isinstance(event, ev.InputAudioBufferClear):
            self.input.clear()
            await self.send(se.InputAudioBufferCleared())
        elif isinstance(event, ev.ResponseCreate):
            await self.responder.create(event, self.config)
        elif isinstance(event, ev.ResponseCancel):
            if not self.busy or (event.response_id and event.response_id != self.response.id):
                raise ev.RealtimeEventError(
                    "no response in progress"
                    + (f" with id {event.response_id!r}" if event.response_id else ""),
                    code="response_cancel_not_active",
                    event_id=event.event_id,
                )
            await self.cancel()
        elif isinstance(event, ev.OutputAudioBufferClear):
            r = self.response
            # in flight, or written but maybe still playing: cut to what was played (nothing when
            # all of it was)
            cut = r is not None and (self.busy or r.whole)
            if self.busy:
                await self.cancel()
            if cut:
                await self.responder.cut_to_played(r)
            await self.send(se.OutputAudioBufferCleared(response_id=r.id if r else None))
        elif isinstance(event, ev.ConversationItemCreate):
            await self._create_item(event)
        elif isinstance(event, ev.ConversationItemDelete):
            item = self.conversation.find(event.item_id, event.event_id)
            if self.response is not None and self.response.item is item and self.busy:
                raise ev.RealtimeEventError(
                    "the item of the response in progress cannot be deleted; cancel it first",
                    event_id=event.event_id,
                )
            self.conversation.items.remove(item)
            await self.send(se.ConversationItemDeleted(item_id=item.id))
        elif isinstance(event, ev.ConversationItemTruncate):
            await self._truncate(event)
        elif isinstance(event, ev.ConversationItemRetrieve):
            item = self.conversation.find(event.item_id, event.event_id)
            await self.send(se.ConversationItemRetrieved(item=item.describe()))
        elif isinstance(event, ev.PlaybackProgress) and not self.played(event.item_id, event.played_ms):
            raise ev.RealtimeEventError(
                f"playback progress for {event.item_id!r}, not the current response's item",
                code="item_not_found",
                event_id=event.event_id,
            )

    async def _update_session(self, event: ev.SessionUpdate) -> None:
        await self._configure(event.session, event.event_id)
        await self.send(se.SessionUpdated(session=self.describe()))

    async def _configure(self, given: dict, event_id: str | None) -> None:
        """As OpenAI's `session.update`: fields not given keep their values. A field this session
        cannot take (it does not validate, or this deployment lacks it: a voice, more than its token
        cap) gets an `error` event naming it and keeps its value; the rest applies."""
        refused = []
        while True:
            config, given, bad = ev.updated(self.config, given)
            deployment = await refusals(config, given, self.profile, self.pipeline)
            refused += bad + deployment
            smaller = functools.reduce(ev.without, (loc for loc, _ in deployment), given)
            if not deployment or smaller == given:
                break
            given = smaller
        for loc, why in refused:
            where = ".".join(str(part) for part in loc)
            await self.send(
                se.error(f"session.{where}: {why}", "invalid_value", event_id, param=f"session.{where}")
            )
        if not deployment and len(config.model_dump_json()) > ev.MAX_SESSION_BYTES:
            why = f"session settings would be larger than {ev.MAX_SESSION_BYTES} bytes; nothing applied"
            await self.send(se.error(why, "invalid_value", event_id, param="session"))
            return
        if not deployment:
            if config.audio.input.format.type != self.config.audio.input.format.type:
                self.input.audio = InputAudio(config.audio.input.format.type)
            # VAD starts over only for new turn detection: an update of other settings while the
            # user speaks (a voice agent's instructions for the next answer) keeps the turn.
            new_detection = config.audio.input.turn_detection != self.config.audio.input.turn_detection
            self.config = config
            if new_detection:
                self.input.start_vad(self.config.audio.input.turn_detection)

    async def spend_audio(self, seconds: float, event_id: str | None) -> None:
        try:
            await self.pipeline.quota.spend_session_audio(self.tenant, self.id, seconds)
        except OmniError as e:
            raise ev.RealtimeEventError(
                e.message, code=e.code or "rate_limit_exceeded", event_id=event_id
            ) from None

    async def _create_item(self, event: ev.ConversationItemCreate) -> None:
        """A client's item into the conversation: after `previous_item_id` ("root": first), else last."""
        item = self.conversation.parse(event.item, event.event_id, self.config.audio.input.format.type)
        if item.clips:  # typed audio is the tenant's audio too
            await self.spend_audio(item.seconds, event.event_id)
        previous = self.conversation.insert(item, event.previous_item_id, event.event_id)
        await self.send(se.ConversationItemAdded(previous_item_id=previous, item=item.describe()))
        await self.send(se.ConversationItemDone(previous_item_id=previous, item=item.describe()))
        # Items between responses are bounded as a response's window is (each create would
        # otherwise grow the conversation, and what is saved of it, without end).
        max_output = max_output_of(self.profile, self.config.max_output_tokens)
        self.conversation.fit(self.config.instructions, max_output, None)

    async def _truncate(self, event: ev.ConversationItemTruncate) -> None:
        item = self.conversation.truncate(event)
        if self.response is not None and self.response.item is item:
            self.monitor.truncated(self.key, event.audio_end_ms)
        await self.send(se.ConversationItemTruncated(item_id=item.id, audio_end_ms=event.audio_end_ms))

    async def close(self) -> None:
        self.life.to(Phase.CLOSED)
        if self.saver is not None:
            self.saver.stopped = True
        await self.cancel()
        if self.saver is not None:
            await self.saver.saved()  # the last boundary's save finishes
        if self.input.ahead is not None:
            self.input.ahead.cancel()
        for task in self.transcribing:
            task.cancel()
        if not self.taken:  # a resumed session's entry is the new connection's
            self.monitor.close(self.key)
