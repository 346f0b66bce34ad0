"""What a realtime conversation holds (its items: messages, function calls and their outputs) and
a response in flight, as the session keeps them."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Literal

from services.pipeline.tools import ToolCall, Tools
from services.pipeline.turn import AudioClip, ImageInput, Message
from services.realtime import server_events as se


@dataclass
class Item:
    id: str
    role: str  # "user" (audio and/or text) or "assistant" (its text, spoken or written)
    # user: the turn's audio as clips (a streaming encoder's chunks, or one), kept while the turn is
    # in the conversation window (the thinker is stateless: every response sends the conversation
    # again), freed with the item when it leaves.
    clips: list[AudioClip] = field(default_factory=list)
    images: list[ImageInput] = field(default_factory=list)  # user: images sent with the message
    # user: camera frames shown while the turn was spoken (services/realtime/camera.py); after its
    # audio in the prompt, so that the turn's speculative prefill stays a prefix of it
    frames: list[ImageInput] = field(default_factory=list)
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
            content += [se.Content(type="input_image") for _ in self.frames]
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
            return Message(
                "user", (*([self.text] if self.text else []), *self.images, *self.clips, *self.frames)
            )
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
