"""The conversation a realtime session keeps: its items in order (what every response sends the
model again: the thinker is stateless) and the window that bounds them — the oldest turns dropped,
with their audio, when the next request could not carry them (services/realtime/history.py) —
fitted with what the last prompt measured."""

from __future__ import annotations

import math

from services.common.errors import OmniError
from services.models.profile import Profile
from services.pipeline import media
from services.pipeline.prompt import segment_tokens
from services.pipeline.tools import Tools
from services.pipeline.tools import asked as tools_asked
from services.pipeline.turn import AudioClip, ImageInput, Message, Sampling, SpeechOut, Turn
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.codecs import PCM_RATE, InputAudio
from services.realtime.history import HistoryLimits, TurnCost, turns_to_drop
from services.realtime.items import Item
from services.realtime.stats import RealtimeStats


class Conversation:
    def __init__(self, profile: Profile, stats: RealtimeStats):
        self.profile, self.stats = profile, stats
        self.id = se.new_id("conv")
        self.items: list[Item] = []  # the conversation window: turns out of it are dropped
        # What the prompts are made of, measured on the last response's (see measure): tokens before
        # the first turn (template, instructions), template tokens per turn, tokens per audio second.
        self.head_tokens = 0
        self.turn_overhead = 0
        self.audio_rate = 0.0

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def insert(self, item: Item, previous_item_id: str | None, event_id: str | None) -> str | None:
        """`item` after `previous_item_id` ("root": first; None: last); the id of the item before it."""
        at = len(self.items)
        if previous_item_id == "root":
            at = 0
        elif previous_item_id is not None:
            at = self.items.index(self.find(previous_item_id, event_id)) + 1
        self.items.insert(at, item)
        return self.items[at - 1].id if at > 0 else None

    def truncate(self, event: ev.ConversationItemTruncate) -> Item:
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
        return item

    def find(self, item_id: str, event_id: str | None) -> Item:
        item = next((i for i in self.items if i.id == item_id), None)
        if item is None:
            raise ev.RealtimeEventError(f"no item {item_id[:64]!r}", code="item_not_found", event_id=event_id)
        return item

    def parse(self, given: ev.ItemIn, event_id: str | None, input_format: str) -> Item:
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
        audio = InputAudio(input_format)  # in the session's input format
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

    def turns(self, pending: Item | None = None, items: list[Item] | None = None) -> list[list[Item]]:
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
            clips=len(user.clips) + len(user.images) + len(user.frames),  # media items of the request
            messages=1 + len(replies),
            tokens=audio + sum(item.text_tokens for item in [user, *replies]) + self.turn_overhead,
        )

    def fit(self, instructions: str | None, max_output: int, pending: Item | None) -> None:
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
        self.drop_turns(turns_to_drop([self._cost(turn) for turn in self.turns(pending)], budget))

    def drop_turns(self, n: int) -> None:
        """Drop the `n` oldest turns of the conversation."""
        if n > 0:
            del self.items[: sum(len(turn) for turn in self.turns()[:n])]
            self.stats.history_trimmed(n)

    def measure(self, turns: list[list[Item]], prepared) -> None:
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

    def request(
        self,
        session: ev.SessionConfig,
        session_id: str,
        config: ev.ResponseConfig,
        pending: Item | None = None,
        items: list[Item] | None = None,
    ) -> tuple[Turn, list[list[Item]]]:
        """The conversation as the pipeline's Turn (with `pending`: a turn still being spoken, last),
        once the turns it cannot carry are dropped; and the turns it holds. With `items`: those
        instead of the conversation (a response's own `input`), as they are."""
        modalities = config.output_modalities or session.output_modalities
        instructions = config.instructions or session.instructions
        limit = config.max_output_tokens or session.max_output_tokens
        max_output = max_output_of(self.profile, limit)
        if max_output > (cap := self.profile.limits.max_tokens_cap):  # before the window is cut to fit it
            raise ev.RealtimeEventError(f"max_output_tokens must be at most {cap}")
        if items is None:
            self.fit(instructions, max_output, pending)
        turns = self.turns(pending, items)
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
            speech = SpeechOut(session.audio.output.voice or self.profile.pipeline.default_voice, "pcm16")
        turn = Turn(
            model=self.profile.served_model_name,
            messages=tuple(messages),
            sampling=Sampling(
                max_tokens=limit if isinstance(limit, int) else None, seed=session.omniray.seed
            ),
            speech=speech,
            session=session_id,
            realtime=True,
            tools=offered(
                session.tools if config.tools is None else config.tools,
                config.tool_choice or session.tool_choice,
            ),
        )
        return turn, turns


def max_output_of(profile: Profile, limit: int | str | None) -> int:
    """A response's token budget: its `max_output_tokens`, or the profile's default ("inf", unset)."""
    return limit if isinstance(limit, int) else profile.pipeline.default_max_tokens


def offered(tools: list[ev.FunctionTool], choice: ev.ToolChoice) -> Tools | None:
    """What a response offers and asks (None: no function calling); one call a response."""
    named = isinstance(choice, ev.NamedTool)
    return tools_asked(
        [(t.name, t.description, t.parameters) for t in tools],
        None if named else choice,
        choice.name if named else "",
        parallel=False,
    )
