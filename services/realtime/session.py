"""One realtime conversation: the input audio buffer, the conversation items, and at most one
response in flight, run through the same pipeline as chat completions (encode → prefill → decode →
talker → vocoder) with the session's turns as its messages.

Transport-free: `handle` takes a raw client event and `send` (given by the WebSocket or gRPC
endpoint) takes typed server events (services/realtime/server_events.py). A malformed or unknown event gets an `error` event; the
session goes on. The conversation is kept typed: a user turn is its audio as decoded clips
(services/pipeline/turn.py), each resampled, hashed and encoded once — a response sends the pipeline
the session's items as they are, so a turn costs the audio it adds, not the whole history again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from services.common.errors import OmniError, internal_error
from services.common.session_key import SessionKey
from services.models.profile import Profile
from services.pipeline import media
from services.pipeline.prompt import segment_tokens
from services.pipeline.structured_output import checked_json_schema
from services.pipeline.tools import ToolCall, Tools
from services.pipeline.tools import asked as tools_asked
from services.pipeline.turn import (
    AudioClip,
    ImageInput,
    Message,
    Sampling,
    SpeechOut,
    TranscriptionTurn,
    Turn,
)
from services.playback.monitor import PlaybackMonitor
from services.policies.admission import AimdAdmission
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.codecs import PCM_RATE, InputAudio, OutputAudio
from services.realtime.continuity import Lapsed, SavedItem, SavedState, SessionStore, Taken
from services.realtime.history import HistoryLimits, TurnCost, turns_to_drop
from services.realtime.stats import RealtimeStats
from services.realtime.vad import SileroStream, TurnSegmenter

log = logging.getLogger(__name__)
# Client events after which the session is saved for a reconnect (a turn boundary of the client's)
SAVE_WAIT_S = 5.0  # at close, how long the last save may still take
SAVED_AFTER = (
    ev.SessionUpdate,
    ev.ConversationItemCreate,
    ev.ConversationItemDelete,
    ev.ConversationItemTruncate,
)


@dataclass
class Item:
    id: str
    role: str  # "user" (audio and/or text) or "assistant" (its text, spoken or written)
    # user: the turn's audio as clips (a streaming encoder's chunks, or one), kept while the turn is
    # in the conversation window (the thinker is stateless: every response sends the conversation
    # again), freed with the item when it leaves.
    clips: list[AudioClip] = field(default_factory=list)
    images: list[ImageInput] = field(default_factory=list)  # user: images sent with the message
    audio_tokens: int | None = None  # user: prompt tokens of its audio, once measured in a prompt
    # user: the text the client typed; assistant: what the conversation keeps (all of it, or what
    # was played)
    text: str = ""
    tokens: int = 0  # assistant: tokens generated
    generated: str = ""  # assistant: all text generated
    spoken: list[list] = field(default_factory=list)  # assistant: [text piece, ms of its audio]
    audio_out: bool = True  # assistant: its content is audio with a transcript (else text)
    transcript: str | None = None  # user: its audio as transcribed (`audio.input.transcription`)
    # "message"; "function_call" (assistant: `text` holds its arguments); "function_call_output"
    # (role "tool": `text` holds the output)
    kind: str = "message"
    call_id: str = ""
    name: str = ""  # function_call: the function

    @property
    def audio_ms(self) -> float:
        return sum(ms for _, ms in self.spoken)

    @property
    def seconds(self) -> float:
        return sum(clip.seconds for clip in self.clips)

    @property
    def kept_tokens(self) -> int:
        """assistant: the generated tokens of the text kept (all, or the played share of a cut)."""
        return round(self.tokens * len(self.text) / len(self.generated)) if self.generated else 0

    @property
    def text_tokens(self) -> int:
        """Tokens of the item's text in a prompt: counted for what the model wrote, estimated
        (4 characters a token) for what a client wrote, until a prompt measures the turn."""
        return self.kept_tokens if self.generated else math.ceil(len(self.text) / 4)

    def cut(self, audio_end_ms: float) -> None:
        """Keep the text spoken in the first `audio_end_ms` of audio: whole pieces played, and of
        the piece playing then the part in proportion to its audio (cut at a word boundary). Text
        generated but not yet spoken is dropped. Always from what was generated, so cuts repeat."""
        kept, at = "", 0.0
        for piece, ms in self.spoken:
            if at + ms <= audio_end_ms:
                kept += piece
            else:
                n = int(len(piece) * max(0.0, audio_end_ms - at) / ms) if ms else 0
                cut = piece.rfind(" ", 0, n + 1)
                kept += piece[: max(cut, 0)]
                break
            at += ms
        self.text = kept

    def describe(
        self, status: str = "completed"
    ) -> se.Item | se.FunctionCallItem | se.FunctionCallOutputItem:
        if self.kind == "function_call":
            return se.FunctionCallItem(
                id=self.id, status=status, call_id=self.call_id, name=self.name, arguments=self.text
            )
        if self.kind == "function_call_output":
            return se.FunctionCallOutputItem(id=self.id, call_id=self.call_id, output=self.text)
        if self.role == "user":
            content = [se.Content(type="input_text", text=self.text)] if self.text else []
            content += [se.Content(type="input_image") for _ in self.images]
            content += [se.Content(type="input_audio", transcript=self.transcript)] if self.clips else []
        elif status == "in_progress":
            content = []  # as OpenAI's: the content comes as its parts are added
        elif self.audio_out:
            content = [se.Content(type="output_audio", transcript=self.text)]
        else:
            content = [se.Content(type="output_text", text=self.text)]
        return se.Item(id=self.id, role=self.role, status=status, content=content)

    def part(self) -> se.Part:
        """assistant: its content part as the response writes it."""
        return (
            se.Part(type="audio", transcript=self.text)
            if self.audio_out
            else se.Part(type="text", text=self.text)
        )

    def message(self) -> Message:
        if self.kind == "function_call":
            return Message("assistant", (), tool_calls=(ToolCall(self.call_id, self.name, self.text),))
        if self.kind == "function_call_output":
            return Message("tool", (self.text,), tool_call_id=self.call_id)
        if self.role == "user":
            return Message("user", (*([self.text] if self.text else []), *self.images, *self.clips))
        return Message("assistant", (self.text,))


@dataclass
class Response:
    id: str
    item: Item
    modalities: list[str]
    in_conversation: bool = True  # False: out of band (`conversation: "none"`)
    metadata: dict[str, str] | None = None
    task: asyncio.Task | None = None
    status: str = "in_progress"
    details: se.StatusDetails | None = None
    usage: se.Usage = field(default_factory=se.Usage)
    audio_in_tokens: int = 0  # the prompt's user audio rows (usage details)
    tools: Tools | None = None  # offered (its answer may be calls)
    output: list[Item] = field(default_factory=list)  # its output items as they began
    message: Literal["none", "open", "done"] = "none"  # its message item
    previous: str | None = None  # the conversation item before its message
    cancel_reason: str = "client_cancelled"  # or turn_detected (a barge-in)

    @property
    def item_status(self) -> str:
        return "completed" if self.status == "completed" else "incomplete"

    @property
    def whole(self) -> bool:
        """Generated to its end: the model stopped, or `max_output_tokens` did (OpenAI's
        `incomplete`); not cancelled or failed."""
        return self.status in se.WHOLE


def unserved(config: ev.SessionConfig, profile: Profile) -> list[tuple[tuple, str]]:
    """Settings this deployment does not serve (its voices, its model, its token cap), as (field,
    why); checked without a session too (settings sent ahead of one: services/gateway/realtime_auth.py)."""
    refused = []
    voice = config.audio.output.voice
    if voice is not None and profile.voice(voice) is None:
        why = f"unknown voice {voice[:64]!r}; available: {profile.voice_names()}"
        refused.append((("audio", "output", "voice"), why))
    if config.model is not None and not profile.serves(config.model):
        why = f"model {config.model[:64]!r} is not served here; this deployment serves {profile.served_model_name!r}"
        refused.append((("model",), why))
    cap = profile.limits.max_tokens_cap
    if isinstance(config.max_output_tokens, int) and config.max_output_tokens > cap:
        refused.append((("max_output_tokens",), f"must be at most {cap}"))
    return refused


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
    ):
        self.pipeline, self.profile, self.tenant, self.monitor = pipeline, profile, tenant, monitor
        self.admission, self.stats = admission, stats
        self.id = session_id
        # The pipeline scopes session ids by tenant; the monitor (and the board the engines read)
        # uses that same key, so a request's session names its board entry.
        self.key = str(SessionKey(tenant.id, session_id))
        self.send = send
        self.config = ev.SessionConfig()
        self.input_audio = InputAudio(self.config.audio.input.format.type)
        self.buffer = bytearray()
        self.buffer_start = 0  # position of buffer[0] in the session's input audio, in samples
        self.items: list[Item] = []  # the conversation window: turns out of it are dropped
        # What the prompts are made of, measured on the last response's (see _measure): tokens before
        # the first turn (template, instructions), template tokens per turn, tokens per audio second.
        self.head_tokens = 0
        self.turn_overhead = 0
        self.audio_rate = 0.0
        self.response: Response | None = None
        self.conversation_id = se.new_id("conv")
        self.next_item_id = se.new_id("item")  # the user item speech will become
        self.vad: SileroStream | None = None
        self.turns: TurnSegmenter | None = None
        self.speech_start_ms: float | None = None
        ahead = profile.realtime.speculative_prefill
        self.chunk_bytes = ahead.chunk_ms * PCM_RATE // 1000 * 2 if ahead.enabled else 0
        self.ahead: asyncio.Task | None = None  # the speculative prefill in flight
        self.ahead_chunks = 0  # chunks of the current turn prefilled (or being prefilled) so far
        self.ahead_paid_s = 0.0  # audio of the current turn debited by speculative prefill
        # The current turn's audio chunks made into clips so far (speculative prefill): chunk k of
        # the turn, reused by the committed turn, so each chunk is resampled and encoded once.
        self.turn_clips: dict[int, tuple[bytes, AudioClip]] = {}
        self.transcribing: set[asyncio.Task] = set()  # input transcriptions beside the responses
        # Saved for a reconnect (services/realtime/continuity.py): the store and this connection's
        # owner token; the clips already saved; the save in flight and whether another is due.
        self.continuity = continuity
        self._saved_clips: set[str] = set()
        self._saving: asyncio.Task | None = None
        self._save_again = False
        self.closing = False
        # This replica drains: the session moves at its next turn boundary (`migrating`), then is
        # `moved` — its client told to reconnect elsewhere, its tenant slot kept for that reconnect.
        self.migrating = False
        self.moved = False
        # Another connection resumed this session: this one ends (its transport waits on `ended`)
        # and gives back neither the tenant's session slot nor the monitor's entry (now the new one's).
        self.taken = False
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()  # one per session
        self._start_vad()

    def _start_vad(self) -> None:
        """(Re)start server VAD at the current input position with the session's settings."""
        td = self.config.audio.input.turn_detection
        self.vad = SileroStream(PCM_RATE) if td else None
        self.turns = TurnSegmenter(td, origin_ms=self.input_ms) if td else None
        self._speech_started_at(None)

    def _speech_started_at(self, audio_start_ms: float | None) -> None:
        self.speech_start_ms = audio_start_ms
        self.ahead_chunks = 0
        if audio_start_ms is not None:  # a new turn: its audio is not paid for yet, nor encoded
            self.ahead_paid_s = 0.0
            self.turn_clips = {}

    def _offset(self, ms: float) -> int:
        """Where input position `ms` is in the buffer, in bytes (within the buffer)."""
        samples = int(ms * PCM_RATE // 1000) - self.buffer_start
        return min(max(samples, 0) * 2, len(self.buffer))

    def _speech_offset(self) -> int:
        """Where the turn being spoken starts in the buffer, in bytes."""
        return self._offset(self.speech_start_ms)

    @property
    def input_ms(self) -> float:
        return (self.buffer_start + len(self.buffer) // 2) / PCM_RATE * 1000

    def _drop_buffer(self, upto: int | None = None) -> bytes:
        """Take the buffer's first `upto` bytes (all by default) out of it."""
        upto = len(self.buffer) if upto is None else upto
        taken = bytes(self.buffer[:upto])
        del self.buffer[:upto]
        self.buffer_start += upto // 2
        return taken

    def _clips(self, pcm: bytes | bytearray) -> list[AudioClip]:
        """A turn's audio (from its start) as clips: chunks of the streaming encoder's size when
        speculative prefill is on — its first chunks are then the same clips (the same objects, so
        encoded once) whether the turn is complete or still being spoken — else one clip."""
        step = self.chunk_bytes or len(pcm)
        clips = []
        for k, at in enumerate(range(0, len(pcm), step)):
            chunk = bytes(pcm[at : at + step])
            seen, clip = self.turn_clips.get(k, (b"", None))
            if clip is None or seen != chunk:
                clip = AudioClip.from_pcm16(chunk, PCM_RATE, keep=True)
                if len(chunk) == step:  # only whole chunks recur
                    self.turn_clips[k] = (chunk, clip)
            clips.append(clip)
        return clips

    # ---- events ---------------------------------------------------------------------------------

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
            await self.send(se.SessionResumed(session_id=self.id, items=[i.describe() for i in self.items]))
        self._save_soon()  # a session resumable from its start (its settings)

    # ---- continuity (services/realtime/continuity.py) -------------------------------------------

    def restore(self, state: SavedState, clips: dict[str, np.ndarray]) -> None:
        """The saved session, before `start`: settings, conversation, prompt measurements."""
        self.config = ev.SessionConfig.model_validate(state.config)
        self.input_audio = InputAudio(self.config.audio.input.format.type)
        self.conversation_id = state.conversation_id
        self.head_tokens, self.turn_overhead, self.audio_rate = (
            state.head_tokens,
            state.turn_overhead,
            state.audio_rate,
        )
        self.items = []
        for saved in state.items:
            fields = saved.model_dump(exclude={"clips"})
            samples = [clips[name] for name in saved.clips]
            item_clips = [AudioClip(rate=PCM_RATE, frames=len(x), samples=x, keep=True) for x in samples]
            self.items.append(Item(**fields, clips=item_clips))
        self._saved_clips = {name for saved in state.items for name in saved.clips}
        self._start_vad()

    def _snapshot(self) -> tuple[SavedState, dict[str, np.ndarray], list[str]]:
        items, new_clips, names = [], {}, set()
        for item in self.items:
            item_names = [f"clip:{item.id}:{k}" for k in range(len(item.clips))]
            for name, clip in zip(item_names, item.clips, strict=True):
                names.add(name)
                if name not in self._saved_clips:
                    new_clips[name] = clip.samples()
            fields = {f: getattr(item, f) for f in SavedItem.model_fields if f != "clips"}
            items.append(SavedItem(**fields, clips=item_names))
        state = SavedState(config=self.config.model_dump(), conversation_id=self.conversation_id, items=items,
                           head_tokens=self.head_tokens, turn_overhead=self.turn_overhead,
                           audio_rate=self.audio_rate)  # fmt: skip
        return state, new_clips, sorted(self._saved_clips - names)

    def _save_soon(self) -> None:
        """Save the session at a turn boundary (one save at a time; a boundary during a save makes
        one more after it)."""
        if self.continuity is None or self.closing:
            return
        if self._saving is not None and not self._saving.done():
            self._save_again = True
            return
        self._saving = asyncio.create_task(self._save())

    async def _save(self) -> None:
        while self.continuity is not None:
            self._save_again = False
            store, owner = self.continuity
            key = SessionKey(self.tenant.id, self.id)
            try:
                state, new_clips, gone = self._snapshot()
                await store.save(key, owner, state, new_clips, gone)
            except Taken:  # resumed by another connection: this one ends
                self.stats.saves.inc(tags={"outcome": "taken"})
                await self.taken_over()
                return
            except Lapsed:  # no save for grace_s while connected: a new record, every clip again
                with contextlib.suppress(Exception):
                    await store.claim(key, owner)
                    self._saved_clips = set()
                    self._save_again = True
            except Exception as e:  # Redis away: this turn cannot be resumed; the session goes on
                self.stats.saves.inc(tags={"outcome": "failed"})
                log.warning("realtime session %s: save failed: %s", self.key, e)
            else:
                self.stats.saves.inc(tags={"outcome": "ok"})
                self._saved_clips = (self._saved_clips | new_clips.keys()) - set(gone)
            if not self._save_again or self.closing:
                return

    async def _saved(self) -> None:
        """Wait for the save in flight, if any, up to SAVE_WAIT_S (a failed one is counted)."""
        if self._saving is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._saving), SAVE_WAIT_S)

    async def migrate(self) -> None:
        """This gateway replica drains: the session moves at its next turn boundary — now when no
        response is in flight, else when the response is done. Without continuity (off, or its
        store unreachable at open) it cannot move and goes on until the replica stops."""
        if self.continuity is None or self.closing:
            return
        self.migrating = True
        if not self.busy:
            await self._hand_over()

    async def _hand_over(self) -> None:
        """Save the conversation as it is, tell the client to reconnect with its id, end here."""
        if self.closing or self.ended.done() or self.continuity is None:
            return
        self._save_soon()
        await self._saved()
        with contextlib.suppress(Exception):
            await self.send(se.SessionMigrate(session_id=self.id))
        self.moved = True
        self.stats.migrations.inc()
        if not self.ended.done():
            self.ended.set_result(None)

    async def taken_over(self) -> None:
        """Another connection resumed this session: say so and end this one."""
        self.taken, self.continuity = True, None
        with contextlib.suppress(Exception):
            await self.send(se.error("this session was resumed by another connection", "session_taken_over"))
        if not self.ended.done():
            self.ended.set_result(None)

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

    async def append_audio(self, pcm16: bytes, event_id: str | None = None) -> None:
        """User audio (pcm16 at 24 kHz) into the input buffer, through server VAD when it is on:
        a client's `input_audio_buffer.append`, or a transport's own audio track (WebRTC)."""
        limit = int(self.profile.limits.max_audio_seconds * PCM_RATE * 2)
        if len(self.buffer) + len(pcm16) > limit:
            raise ev.RealtimeEventError(
                f"input audio buffer would exceed {self.profile.limits.max_audio_seconds} s",
                code="input_audio_buffer_full",
                event_id=event_id,
            )
        self.buffer += pcm16
        if self.vad is not None:
            await self._detect(pcm16)
            self._prefill_ahead()

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
        return self.response is not None and self.response.status == "in_progress"

    async def handle_invalid(self, why: str) -> None:
        """A client event the transport could not decode."""
        await self.send(se.error(why, "invalid_event"))

    async def _dispatch(self, event: Any) -> None:
        if isinstance(event, ev.SessionUpdate):
            await self._update_session(event)
        elif isinstance(event, ev.InputAudioBufferAppend):
            await self.append_audio(self.input_audio.decode(event.data(), event.event_id), event.event_id)
        elif isinstance(event, ev.InputAudioBufferCommit):
            await self._commit(event)
        elif isinstance(event, ev.InputAudioBufferClear):
            self._drop_buffer()
            self._speech_started_at(None)
            self.turn_clips = {}
            await self.send(se.InputAudioBufferCleared())
        elif isinstance(event, ev.ResponseCreate):
            await self._create_response(event)
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
                await self._cut_to_played(r)
            await self.send(se.OutputAudioBufferCleared(response_id=r.id if r else None))
        elif isinstance(event, ev.ConversationItemCreate):
            await self._create_item(event)
        elif isinstance(event, ev.ConversationItemDelete):
            item = self._find(event.item_id, event.event_id)
            if self.response is not None and self.response.item is item and self.busy:
                raise ev.RealtimeEventError(
                    "the item of the response in progress cannot be deleted; cancel it first",
                    event_id=event.event_id,
                )
            self.items.remove(item)
            await self.send(se.ConversationItemDeleted(item_id=item.id))
        elif isinstance(event, ev.ConversationItemTruncate):
            await self._truncate(event)
        elif isinstance(event, ev.ConversationItemRetrieve):
            item = self._find(event.item_id, event.event_id)
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
            deployment = await self._check(config, given)
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
                self.input_audio = InputAudio(config.audio.input.format.type)
            # VAD starts over only for new turn detection: an update of other settings while the
            # user speaks (a voice agent's instructions for the next answer) keeps the turn.
            new_detection = config.audio.input.turn_detection != self.config.audio.input.turn_detection
            self.config = config
            if new_detection:
                self._start_vad()

    async def _check(self, config: ev.SessionConfig, given: dict) -> list[tuple[tuple, str]]:
        """What only this deployment knows (its voices, its token cap, what it does with tools), as
        (field, why) refused; a refusal names a field of `given` (what the update changed)."""
        refused = unserved(config, self.profile)
        if (tools := self._tools(config.tools, config.tool_choice)) is not None:
            try:
                if schema := self.pipeline.checks.tool_schema(tools):
                    await checked_json_schema(schema, param="tools", what="tools")
            except OmniError as e:
                field = e.param if e.param in given else ("tools" if "tools" in given else "tool_choice")
                refused.append(((field,), e.message))
        if (asked := config.audio.input.transcription) is not None:
            try:
                self.pipeline.transcription.check(self._transcription_turn(asked, None))
            except OmniError as e:
                refused.append((("audio", "input", "transcription"), e.message))
        return refused

    @staticmethod
    def _tools(tools: list[ev.FunctionTool], choice: ev.ToolChoice) -> Tools | None:
        """What a response offers and asks (None: no function calling); one call a response."""
        named = isinstance(choice, ev.NamedTool)
        return tools_asked(
            [(t.name, t.description, t.parameters) for t in tools],
            None if named else choice,
            choice.name if named else "",
            parallel=False,
        )

    def _transcription_turn(self, asked: ev.InputTranscription, clip: AudioClip | None) -> TranscriptionTurn:
        # the deployment's transcriber, whatever model the client names (served names only otherwise)
        return TranscriptionTurn(
            self.profile.served_model_name, clip, asked.language or "", asked.prompt or ""
        )

    def _find(self, item_id: str, event_id: str | None) -> Item:
        item = next((i for i in self.items if i.id == item_id), None)
        if item is None:
            raise ev.RealtimeEventError(f"no item {item_id[:64]!r}", code="item_not_found", event_id=event_id)
        return item

    def _item(self, given: ev.ItemIn, event_id: str | None) -> Item:
        """A client's item as the conversation keeps it: a user message (text and/or 24 kHz pcm16
        audio) or an assistant message (its text, or the transcript of its audio)."""
        if given.type in ("function_call", "function_call_output"):
            return self._function_item(given, event_id)
        if given.type != "message":
            raise ev.RealtimeEventError(
                f"{given.type} is not an item type a conversation holds",
                code="invalid_value",
                event_id=event_id,
            )
        if given.role not in ("user", "assistant"):
            raise ev.RealtimeEventError(
                "items are user or assistant messages; set the system prompt with `instructions`",
                code="invalid_value",
                event_id=event_id,
            )
        item_id = given.id or se.new_id("item")
        if any(i.id == item_id for i in self.items):
            raise ev.RealtimeEventError(f"item {item_id!r} exists", code="invalid_value", event_id=event_id)
        user = given.role == "user"
        allowed = (
            {"input_text", "input_audio", "input_image"}
            if user
            else {"output_text", "output_audio", "text", "audio"}
        )
        if not given.content or any(part.type not in allowed for part in given.content):
            raise ev.RealtimeEventError(
                f"a {given.role} message holds content of types {sorted(allowed)}", code="invalid_value",
                event_id=event_id,
            )  # fmt: skip
        text = "".join(part.text or part.transcript or "" for part in given.content)
        if not user:
            audio_out = any(part.type in ("output_audio", "audio") for part in given.content)
            return Item(item_id, "assistant", text=text, audio_out=audio_out)
        audio = InputAudio(self.config.audio.input.format.type)  # in the session's input format
        pcm = b"".join(
            audio.decode(part.data(event_id), event_id)
            for part in given.content
            if part.type == "input_audio"
        )
        if len(pcm) > self.profile.limits.max_audio_seconds * PCM_RATE * 2:
            raise ev.RealtimeEventError(
                f"item audio is longer than {self.profile.limits.max_audio_seconds} s",
                code="invalid_value",
                event_id=event_id,
            )
        images = [self._image(part, k) for k, part in enumerate(given.content) if part.type == "input_image"]
        if not text and not images and len(pcm) < PCM_RATE * 2 // 10:
            raise ev.RealtimeEventError(
                "a user message needs text, an image or at least 100 ms of audio",
                code="invalid_value",
                event_id=event_id,
            )
        clips = [AudioClip.from_pcm16(pcm, PCM_RATE, keep=True)] if pcm else []
        return Item(item_id, "user", clips=clips, images=images, text=text)

    def _image(self, part: ev.ContentPartIn, k: int) -> ImageInput:
        """An `input_image` part (a data: URL) checked as the chat API checks its images."""
        param = f"item.content[{k}].image_url"
        if not self.profile.models.vision:
            raise OmniError(400, "this model does not take images", code="invalid_value", param=param)
        if not part.image_url:
            raise OmniError(400, "an input_image part needs image_url (a data: URL)", code="invalid_value",
                            param=param)  # fmt: skip
        limits = self.profile.limits
        data = media.data_url_bytes(part.image_url, param=param, limit=limits.max_image_bytes)
        return media.image_input(data, part.detail, limits, param=param)

    def _function_item(self, given: ev.ItemIn, event_id: str | None) -> Item:
        """A call the client records (`function_call`: call_id, name, arguments) or the result of one
        (`function_call_output`: call_id, output), which the next response reads."""
        item_id = given.id or se.new_id("item")
        if any(i.id == item_id for i in self.items):
            raise ev.RealtimeEventError(f"item {item_id!r} exists", code="invalid_value", event_id=event_id)
        if not given.call_id:
            raise ev.RealtimeEventError(f"a {given.type} item needs its call_id", code="invalid_value",
                                        event_id=event_id)  # fmt: skip
        if given.type == "function_call":
            if not given.name:
                raise ev.RealtimeEventError("a function_call item needs the function's name",
                                            code="invalid_value", event_id=event_id)  # fmt: skip
            return Item(item_id, "assistant", text=given.arguments or "", kind="function_call",
                        call_id=given.call_id, name=given.name)  # fmt: skip
        if given.output is None:
            raise ev.RealtimeEventError("a function_call_output item needs its output", code="invalid_value",
                                        event_id=event_id)  # fmt: skip
        return Item(item_id, "tool", text=given.output, kind="function_call_output", call_id=given.call_id)

    async def _create_item(self, event: ev.ConversationItemCreate) -> None:
        """A client's item into the conversation: after `previous_item_id` ("root": first), else last."""
        item = self._item(event.item, event.event_id)
        if item.clips:  # typed audio is the tenant's audio too
            await self._spend_audio(item.seconds, event.event_id)
        at = len(self.items)
        if event.previous_item_id == "root":
            at = 0
        elif event.previous_item_id is not None:
            at = self.items.index(self._find(event.previous_item_id, event.event_id)) + 1
        self.items.insert(at, item)
        previous = self.items[at - 1].id if at > 0 else None
        await self.send(se.ConversationItemAdded(previous_item_id=previous, item=item.describe()))
        await self.send(se.ConversationItemDone(previous_item_id=previous, item=item.describe()))
        # Items between responses are bounded as a response's window is (each create would
        # otherwise grow the conversation, and what is saved of it, without end).
        self._fit_history(self.config.instructions, self._max_output(self.config.max_output_tokens), None)

    # ---- server VAD and barge-in ---------------------------------------------------------------

    async def _detect(self, chunk: bytes) -> None:
        probs = await asyncio.to_thread(self.vad.feed, chunk)
        for found in self.turns.push(probs):
            if found.kind == "speech_started":
                await self._speech_started(found.audio_ms)
            else:
                await self._speech_stopped(found.audio_ms)
        if not self.turns.speaking:
            # Audio before the earliest place a coming speech start can reach back to (its window
            # less the prefix padding) can never be part of a turn: an open microphone in a quiet
            # room keeps only the padding's worth, however long it stays open.
            self._drop_buffer(self._offset(self.turns.earliest_start_ms))

    async def _speech_started(self, audio_start_ms: int) -> None:
        """The user talks. Over a response (barge-in) the response stops before anything else is
        sent — no audio delta follows `speech_started` — and the assistant's item is cut to what
        the client played."""
        td = self.config.audio.input.turn_detection
        self._speech_started_at(audio_start_ms)
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
            await self._cut_to_played(r)

    async def _cut_to_played(self, r: Response) -> None:
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

    async def _speech_stopped(self, audio_end_ms: int) -> None:
        td = self.config.audio.input.turn_detection
        self.monitor.speech_stopped(self.key)
        item_id, started = self.next_item_id, self.speech_start_ms is not None
        await self.send(se.InputAudioBufferSpeechStopped(audio_end_ms=audio_end_ms, item_id=item_id))
        if started:  # what came before the speech (and its padding) is not the turn
            self._drop_buffer(self._speech_offset())
        self._speech_started_at(None)
        end = self._offset(audio_end_ms)  # nor is the silence after it
        if end < PCM_RATE * 2 // 10:
            return  # a blip: nothing worth a turn (dropped with the silence around it)
        await self._commit(None, end)
        if td.create_response and (self.response is None or self.response.status != "in_progress"):
            await self._create_response(ev.ResponseCreate(type="response.create"))

    async def _commit(self, event: ev.InputAudioBufferCommit | None, upto: int | None = None) -> None:
        """The buffer's first `upto` bytes (all by default) become a user item."""
        upto = len(self.buffer) if upto is None else upto
        if upto < PCM_RATE * 2 // 10:  # OpenAI's rule: at least 100 ms
            raise ev.RealtimeEventError(
                f"input audio buffer holds {upto / (PCM_RATE * 2) * 1000:.0f} ms; commit needs 100 ms",
                code="input_audio_buffer_commit_empty",
                event_id=event.event_id if event else None,
            )
        # The turn's audio is debited before it is kept (less what speculative prefill paid for).
        seconds = upto / (PCM_RATE * 2)
        try:
            await self.pipeline.quota.spend_session_audio(
                self.tenant, self.id, max(0.0, seconds - self.ahead_paid_s)
            )
        except OmniError as e:
            self._drop_buffer()
            self._speech_started_at(None)
            raise ev.RealtimeEventError(
                e.message, code=e.code or "rate_limit_exceeded", event_id=event.event_id if event else None
            ) from None
        self.ahead_paid_s = 0.0
        previous = self.items[-1].id if self.items else None
        item = Item(self.next_item_id, "user", clips=self._clips(self._drop_buffer(upto)))
        self.turn_clips = {}
        self.next_item_id = se.new_id("item")
        self._speech_started_at(None)
        self.items.append(item)
        self._save_soon()
        await self.send(se.InputAudioBufferCommitted(item_id=item.id, previous_item_id=previous))
        await self.send(se.ConversationItemAdded(previous_item_id=previous, item=item.describe()))
        await self.send(se.ConversationItemDone(previous_item_id=previous, item=item.describe()))
        if (asked := self.config.audio.input.transcription) is not None:
            task = asyncio.create_task(self._transcribe(item, asked))
            self.transcribing.add(task)
            task.add_done_callback(self.transcribing.discard)

    async def _transcribe(self, item: Item, asked: ev.InputTranscription) -> None:
        """A committed turn's transcript, beside its response (off its critical path): deltas as the
        transcriber writes segments, then `.completed` (kept on the item), or `.failed`. The turn's
        audio was paid for when it was committed."""
        clip = item.clips[0] if len(item.clips) == 1 else AudioClip.joined(item.clips)
        texts: list[str] = []
        try:
            t = await self.pipeline.transcription.prepare(
                self._transcription_turn(asked, clip), self.tenant, "realtime", paid=True
            )
            async for segment in self.pipeline.transcription.transcribe(t):
                delta = (" " if texts else "") + segment.text
                texts.append(segment.text)
                await self.send(se.InputAudioTranscriptionDelta(item_id=item.id, delta=delta))
        except Exception as e:
            err = e if isinstance(e, OmniError) else internal_error(e, "input transcription failed")
            detail = se.ErrorDetail(type="server_error" if err.status >= 500 else "invalid_request_error",
                                    code=err.code or "transcription_failed", message=err.message)  # fmt: skip
            await self.send(se.InputAudioTranscriptionFailed(item_id=item.id, error=detail))
            return
        item.transcript = " ".join(texts)
        usage = se.TranscriptionUsage(seconds=round(clip.seconds, 3))
        await self.send(
            se.InputAudioTranscriptionCompleted(item_id=item.id, transcript=item.transcript, usage=usage)
        )

    # ---- speculative prefill --------------------------------------------------------------------

    def _prefill_ahead(self) -> None:
        """While the user speaks, prefill the conversation up to the audio chunks completed so far,
        one request at a time, so that at the end of the turn only its last chunk (and what the
        next chunk adds while one is in flight) remains to prefill."""
        if not self.chunk_bytes or self.speech_start_ms is None or not self._ahead_wanted():
            return
        if self.ahead is not None and not self.ahead.done():
            return
        # Only chunks the VAD has heard as speech: the silence after the speech is not the turn's.
        start, end = self._speech_offset(), self._offset(self.turns.speech_end_ms)
        chunks = (end - start) // self.chunk_bytes
        if chunks <= self.ahead_chunks:
            return
        self.ahead_chunks = chunks
        pending = Item(
            "pending", "user", clips=self._clips(self.buffer[start : start + chunks * self.chunk_bytes])
        )
        self.ahead = asyncio.create_task(self._run_ahead(pending))

    def _ahead_wanted(self) -> bool:
        """The session's own setting (`session.omniray.speculative_prefill`, default on)."""
        return self.config.omniray.speculative_prefill

    async def _run_ahead(self, pending: Item) -> None:
        try:
            # Speculation spends the tenant's realtime audio budget as it goes (the turn's commit
            # then pays only the rest): speaking and clearing cannot buy free prefill.
            seconds = pending.seconds
            await self.pipeline.quota.spend_session_audio(self.tenant, self.id, seconds - self.ahead_paid_s)
            self.ahead_paid_s = seconds
            turn, _ = self._turn(ev.ResponseConfig(), pending)
            tokens = await self.pipeline.prefill_ahead(turn, self.tenant)
            self.stats.prefilled_ahead("done", tokens)
        except asyncio.CancelledError:
            self.stats.prefilled_ahead("cancelled", 0)
            raise
        except Exception as e:  # speculation only: the turn's own request does the work then
            log.warning("session %s: speculative prefill failed: %s", self.key, e)
            self.stats.prefilled_ahead("failed", 0)

    # ---- the conversation window (services/realtime/history.py) -------------------------------

    def _turns(self, pending: Item | None = None, items: list[Item] | None = None) -> list[list[Item]]:
        """The conversation (or `items`) in turns: a user item and the replies after it (with
        `pending`: a turn still being spoken, last). A conversation may start with replies (a bot
        that spoke first): they are a turn of their own."""
        turns: list[list[Item]] = []
        for item in (self.items if items is None else items) + ([pending] if pending is not None else []):
            if item.role == "user" or not turns:
                turns.append([item])
            else:
                turns[-1].append(item)
        return turns

    def _cost(self, turn: list[Item]) -> TurnCost:
        """What a turn adds to a request; its audio tokens estimated until a prompt measured them."""
        user, replies = turn[0], [item for item in turn[1:] if item.text]
        audio = user.audio_tokens
        if audio is None:
            audio = math.ceil(user.seconds * self.audio_rate)
        return TurnCost(
            clips=len(user.clips) + len(user.images),  # media items of the request
            messages=1 + len(replies),
            tokens=audio + sum(item.text_tokens for item in [user, *replies]) + self.turn_overhead,
        )

    def _fit_history(self, instructions: str | None, max_output: int, pending: Item | None) -> None:
        """Drop the oldest turns that the next request (with `pending`) cannot carry, and with them
        their items and audio: what a request may hold is the profile's media-item and message
        limits, `realtime.max_history_turns`, and the context length less the reply's tokens."""
        rt, limits = self.profile.realtime, self.profile.limits
        budget = HistoryLimits(
            turns=rt.max_history_turns,
            clips=limits.max_media_items,
            messages=limits.max_messages - (1 if instructions else 0),
            tokens=self.profile.engine.max_model_len - max_output - self.head_tokens,
            retention=rt.history_retention_ratio,
        )
        self._drop_turns(turns_to_drop([self._cost(turn) for turn in self._turns(pending)], budget))

    def _drop_turns(self, n: int) -> None:
        """Drop the `n` oldest turns of the conversation."""
        if n > 0:
            del self.items[: sum(len(turn) for turn in self._turns()[:n])]
            self.stats.history_trimmed(n)

    def _measure(self, turns: list[list[Item]], prepared) -> None:
        """Learn from the prompt the pipeline built for `turns` what the next windows are fitted
        with: each user turn's audio tokens (its clips' embeddings, in order), the tokens before
        the first clip (template, instructions) and the rest spread over the turns. A cascade's
        encoder gives text, not embeddings: its transcripts count in the per-turn rest."""
        if prepared.prompt is None or not turns:
            return
        users = [turn[0] for turn in turns]
        clips = [len(user.clips) for user in users]
        at, embedded = 0, []  # (position, rows) of each embedding segment
        for segment in prepared.prompt.segments:
            if segment.HasField("embeddings"):
                embedded.append((at, segment_tokens(segment)))
            at += segment_tokens(segment)
        if embedded and len(embedded) == sum(clips):
            self.head_tokens, k = embedded[0][0], 0
            for user, n in zip(users, clips, strict=True):
                user.audio_tokens = sum(rows for _, rows in embedded[k : k + n])
                k += n
            seconds = sum(user.seconds for user in users)
            if seconds > 0:
                audio = sum(user.audio_tokens for user in users)
                self.audio_rate = max(self.audio_rate, audio / seconds)
        known = (
            self.head_tokens
            + sum(user.audio_tokens or 0 for user in users)
            + sum(item.text_tokens for turn in turns for item in turn)
        )
        self.turn_overhead = max(0, math.ceil((prepared.prompt_tokens - known) / len(turns)))

    # ---- responses ------------------------------------------------------------------------------

    def _max_output(self, limit: int | str | None) -> int:
        """A response's token budget: its `max_output_tokens`, or the profile's default ("inf", unset)."""
        return limit if isinstance(limit, int) else self.profile.pipeline.default_max_tokens

    def _turn(
        self, config: ev.ResponseConfig, pending: Item | None = None, items: list[Item] | None = None
    ) -> tuple[Turn, list[list[Item]]]:
        """The conversation as the pipeline's Turn (with `pending`: a turn still being spoken, last),
        once the turns it cannot carry are dropped; and the turns it holds. With `items`: those
        instead of the conversation (a response's own `input`), as they are."""
        modalities = config.output_modalities or self.config.output_modalities
        instructions = config.instructions or self.config.instructions
        limit = config.max_output_tokens or self.config.max_output_tokens
        max_output = self._max_output(limit)
        if max_output > (cap := self.profile.limits.max_tokens_cap):  # before the window is cut to fit it
            raise ev.RealtimeEventError(f"max_output_tokens must be at most {cap}")
        if items is None:
            self._fit_history(instructions, max_output, pending)
        turns = self._turns(pending, items)
        messages = ([Message("system", (instructions,))] if instructions else []) + [
            item.message()
            for turn in turns
            for item in turn
            if item.role == "user" or item.text or item.call_id
        ]
        if not messages:
            raise ev.RealtimeEventError(
                "nothing to respond to: add an item, commit audio or set instructions"
            )
        speech = None
        if "audio" in modalities:
            speech = SpeechOut(self.config.audio.output.voice or self.profile.pipeline.default_voice, "pcm16")
        turn = Turn(
            model=self.profile.served_model_name,
            messages=tuple(messages),
            sampling=Sampling(
                max_tokens=limit if isinstance(limit, int) else None, seed=self.config.omniray.seed
            ),
            speech=speech,
            session=self.id,
            tools=self._tools(
                self.config.tools if config.tools is None else config.tools,
                config.tool_choice or self.config.tool_choice,
            ),
        )
        return turn, turns

    async def _input_items(self, config: ev.ResponseConfig, event_id: str | None) -> list[Item] | None:
        """A response's own `input` (None: the conversation): references to conversation items, or
        new items that stay out of the conversation."""
        if config.input is None:
            return None
        items = []
        for given in config.input:
            if given.type == "item_reference":
                items.append(self._find(given.id or "", event_id))
                continue
            item = self._item(given, event_id)
            if item.clips:
                await self._spend_audio(item.seconds, event_id)
            items.append(item)
        return items

    async def _spend_audio(self, seconds: float, event_id: str | None) -> None:
        try:
            await self.pipeline.quota.spend_session_audio(self.tenant, self.id, seconds)
        except OmniError as e:
            raise ev.RealtimeEventError(
                e.message, code=e.code or "rate_limit_exceeded", event_id=event_id
            ) from None

    async def _create_response(self, event: ev.ResponseCreate) -> None:
        """A response from the conversation (or the response's own `input`), with no new input
        needed: a bot may speak first from its instructions."""
        if self.busy:
            raise ev.RealtimeEventError(
                "a response is already in progress; cancel it first",
                code="conversation_already_has_active_response",
                event_id=event.event_id,
            )
        config = event.response
        items = await self._input_items(config, event.event_id)
        while True:
            try:
                turn, turns = self._turn(config, items=items)
            except ev.RealtimeEventError as e:
                e.event_id = event.event_id
                raise
            try:
                prepared = await self.pipeline.prepare(turn, self.tenant)
                break
            except OmniError as e:
                if e.code == "context_length_exceeded" and items is None and len(turns) > 1:
                    # The window's token estimate fell short (a turn not measured yet, new
                    # instructions): one turn less, and again. Each pass drops a turn, so it ends.
                    self._drop_turns(1)
                    continue
                err = e.body()["error"]
                await self.send(
                    se.error(err["message"], err.get("code") or "invalid_request", event.event_id)
                )
                return
        if items is None:
            self._measure(turns, prepared)
        modalities = list(config.output_modalities or self.config.output_modalities)
        item = Item(se.new_id("item"), "assistant", audio_out="audio" in modalities)
        response = Response(
            se.new_id("resp"), item, modalities, config.conversation == "auto", config.metadata
        )
        response.audio_in_tokens = sum(user.audio_tokens or 0 for turn in turns for user in turn[:1])
        if turn.tools is not None and turn.tools.choice != "none":
            response.tools = turn.tools
        self.response = response
        await self.send(se.ResponseCreated(response=self._describe(response)))
        if buckets := prepared.lease.buckets:  # what the tenant has left after admitting it
            limits = [se.RateLimit(name="tokens" if b.modality == "text_tokens" else b.modality, limit=b.limit,
                                   remaining=round(max(0.0, b.remaining), 3), reset_seconds=round(b.reset_s, 3))
                      for b in buckets]  # fmt: skip
            await self.send(se.RateLimitsUpdated(rate_limits=limits))
        response.task = asyncio.create_task(self._run(response, prepared))

    def _describe(self, r: Response) -> se.Response:
        done = r.status != "in_progress"
        return se.Response(
            id=r.id,
            status=r.status,
            status_details=r.details,
            conversation_id=self.conversation_id if r.in_conversation else None,
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

    async def _run(self, r: Response, prepared) -> None:
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
        audio_out = OutputAudio(self.config.audio.output.format.type)
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
                for d in out.calls:
                    if d.index not in calls:
                        calls[d.index] = await self._add_call(r, ToolCall(d.id, d.name, ""))
                    item = calls[d.index]
                    item.text += d.arguments
                    if d.arguments:
                        await self.send(se.FunctionCallArgumentsDelta(
                            response_id=r.id, item_id=item.id, output_index=r.output.index(item),
                            call_id=item.call_id, delta=d.arguments))  # fmt: skip
                # the event's tokens wrote its last piece: a call's, else the message's
                (calls[out.calls[-1].index] if out.calls else r.item).tokens += out.tokens
                if out.pcm16 and r.message == "open":
                    ms = len(out.pcm16) / 2 / (out.sample_rate or PCM_RATE) * 1000
                    if out.transcript is not None or not r.item.spoken:  # a new spoken piece
                        r.item.spoken.append([out.transcript or "", 0.0])
                    r.item.spoken[-1][1] += ms
                    self.monitor.audio_sent(self.key, ms)
                    if delta := audio_out.encode(out.pcm16):
                        await self.send(se.ResponseOutputAudioDelta(delta=delta, **ids))
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
                item.generated = item.text
                index = r.output.index(item)
                await self.send(se.FunctionCallArgumentsDone(response_id=r.id, item_id=item.id, output_index=index,
                                                             call_id=item.call_id, name=item.name,
                                                             arguments=item.text))  # fmt: skip
                done = item.describe(r.item_status)
                await self.send(se.ResponseOutputItemDone(response_id=r.id, output_index=index, item=done))
                if r.in_conversation:
                    await self.send(se.ConversationItemDone(item=done))
            await self.send(se.ResponseDone(response=self._describe(r)))
            self._save_soon()
            if self.migrating:
                await self._hand_over()

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
            r.previous = self.items[-1].id if self.items else None
            self.items.append(r.item)
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
            previous = self.items[-1].id if self.items else None
            self.items.append(item)
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
        item.cut(event.audio_end_ms)
        if self.response is not None and self.response.item is item:
            self.monitor.truncated(self.key, event.audio_end_ms)
        await self.send(se.ConversationItemTruncated(item_id=item.id, audio_end_ms=event.audio_end_ms))

    async def close(self) -> None:
        self.closing = True
        await self.cancel()
        await self._saved()  # the last boundary's save finishes
        if self.ahead is not None:
            self.ahead.cancel()
        for task in self.transcribing:
            task.cancel()
        if not self.taken:  # a resumed session's entry is the new connection's
            self.monitor.close(self.key)
