"""One chat response as it is generated: the thinker's text (content and tool calls) and, with audio
out, its speech, merged into one stream of Events.

Two tasks: thinking (a document's encoding with progress, then prefill -> decode, the answer split
into content and calls) and speaking (a text talker on the answer's pieces as they close, or a token
talker reading decode's tokens). Text goes out as it is written; audio as the vocoder makes it. The
response ends when both do; thinking that fails fails it at once, speech that fails alone lets the
text finish first. Whatever happens, the quota keeps only what was used."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from omni.v1 import common_pb2, stages_pb2

from services.common.streams import next_batch
from services.dataplane import token_stream
from services.models.profile import Profile
from services.pipeline.events import Event, merged_text
from services.pipeline.prepared import Prepared, Settlement
from services.pipeline.prompt import expanded_ids
from services.pipeline.speaking import Speaking
from services.pipeline.stage_calls import stage_calls
from services.pipeline.text_chunker import TextChunker
from services.pipeline.thinking import Thinking
from services.pipeline.tool_parser import ToolCallParser
from services.pipeline.tools import CallDelta, CallStream, Tools


class ResponseParts(Protocol):
    """What a response is made with (the Pipeline has them)."""

    profile: Profile
    async_chunk: bool
    token_talker: bool
    tool_parser: ToolCallParser | None
    tool_calls: Any  # omniray_gateway_tool_calls_total
    thinking: Thinking
    speaking: Speaking
    settlement: Settlement

    def call_stream(self, tools: Tools | None) -> CallStream | None: ...

    async def build_prompt(self, p: Prepared, progress=None) -> None: ...


@dataclass
class Outcome:
    """What the response has come to, as its tasks find out."""

    generated: int = 0  # tokens decode wrote
    unsent: int = 0  # tokens whose text is held (a call being written): they go with the next piece
    finish_reason: str | None = None
    usage: common_pb2.Usage | None = None
    speech_cut: bool = False  # the speech ended short of the text (the talker's frame limit)


class Generation:
    def __init__(self, pipeline: ResponseParts, p: Prepared):
        self.pipe, self.p = pipeline, p
        self.out: asyncio.Queue = asyncio.Queue()  # events, then one None per task
        self.pieces: asyncio.Queue = asyncio.Queue()  # text pieces for a text talker, then None
        self.outcome = Outcome()
        self.tokens_to = token_stream.key(p.ctx.request_id) if p.plan.speak and pipeline.token_talker else ""
        self.written: list[str] = []  # the answer's content as written (a token talker's transcript)
        self.thought = asyncio.Event()
        self.calls_in = pipeline.call_stream(p.turn.tools)
        self.called: set[int] = set()  # the calls written (by index)
        self.calling = asyncio.Event()  # a tool call began
        # A token talker stops at the call's marker token (tool_parser.call_start_ids) where the
        # model wrote one: it says the lead-in whole rather than being cut when the call is parsed.
        tools, parser = p.turn.tools, pipeline.tool_parser
        parsed = tools is not None and tools.choice == "auto" and parser is not None
        self.stops = frozenset(parser.call_start_ids if self.tokens_to and parsed else ())
        self.marked = asyncio.Event()  # the talker has the marker the call began with
        spec = pipeline.profile.pipeline
        self.chunker = TextChunker(spec.chunk_min_tokens, spec.chunk_max_tokens)

    async def events(self) -> AsyncIterator[Event]:
        p = self.p
        tasks = [asyncio.create_task(self._run(self._think()))]
        if p.plan.speak:
            speak = self._speak_tokens() if self.tokens_to else self._speak_pieces()
            tasks.append(asyncio.create_task(self._run(speak)))
        try:
            done = 0
            while done < len(tasks):
                for ev in merged_text(await next_batch(self.out)):
                    if ev is None:
                        done += 1
                        # Thinking failed: the response fails now and its speech stops (below)
                        # rather than a talker waiting out its thinker. Speech that fails alone
                        # lets the text answer go on (raised at the end).
                        if tasks[0].done() and not tasks[0].cancelled() and tasks[0].exception():
                            tasks[0].result()
                    else:
                        yield ev
            for t in tasks:  # re-raise a stage failure
                t.result()
            usage = self.outcome.usage
            if usage is not None:
                usage.audio_prompt_tokens = p.audio_prompt_tokens
            yield Event(finish_reason=self._finish_reason(), usage=usage, tokens=self.outcome.unsent)
        finally:
            for t in tasks:
                t.cancel()
            await self._settle()

    def _finish_reason(self) -> str:
        finish = self.outcome.finish_reason or "stop"
        # Speech cut short of the text: by the talker's frame limit (UnitChunk.truncated), or at a
        # marker the talker stopped at that began no call (what follows is content it never read).
        if finish == "stop" and (self.outcome.speech_cut or self.marked.is_set()):
            return "length"
        return finish

    async def _settle(self) -> None:
        """The quota keeps what was used: the whole usage, or — a client that left, a stage that
        failed — the prompt and the tokens generated until then; the rest goes back."""
        p, usage = self.p, self.outcome.usage
        text_tokens = (
            usage.prompt_tokens + usage.completion_tokens
            if usage is not None
            else p.prompt_tokens + self.outcome.generated
        )
        await self.pipe.settlement.release(
            p.lease, dataclasses.replace(p.lease.cost, text_tokens=text_tokens)
        )

    async def _run(self, coro: Coroutine) -> None:
        try:
            with stage_calls():
                await coro
        finally:
            await self.out.put(None)

    # ---- thinking ----------------------------------------------------------------------------

    async def _think(self) -> None:
        p = self.p
        try:
            if p.prompt is None:  # a document: encode now, streaming progress
                await self.pipe.build_prompt(p, progress=lambda pr: self.out.put(Event(progress=pr)))
            if p.encoding is None:
                await self._write_answer()
            else:
                await self._write_answer_streamed(p.encoding)
        finally:
            self.thought.set()
            await self.pieces.put(None)  # speaking ends even when thinking failed

    async def _write_answer_streamed(self, encoding: asyncio.Task) -> None:
        """The answer to a prompt whose images are still being encoded (streamed to the thinker):
        an encoding that fails fails the response now, not at the thinker's wait bound."""
        answer = asyncio.ensure_future(self._write_answer())
        try:
            await asyncio.wait({answer, encoding}, return_when=asyncio.FIRST_EXCEPTION)
            if encoding.done() and not encoding.cancelled() and encoding.exception() is not None:
                answer.cancel()
                encoding.result()
            await answer
        finally:
            answer.cancel()
            encoding.cancel()

    async def _write_answer(self) -> None:
        p, outcome, calls_in = self.p, self.outcome, self.calls_in
        chunks = self.pipe.thinking.think(
            p.ctx, p.prompt, p.prompt_tokens, p.sampling, self.tokens_to, realtime=p.turn.realtime
        )
        async for chunk in chunks:
            outcome.generated += len(chunk.token_ids)
            if self.stops and not self.stops.isdisjoint(chunk.token_ids):
                self.marked.set()
            content, calls = calls_in.feed(chunk.text) if calls_in else (chunk.text, [])
            await self._wrote(content, calls, len(chunk.token_ids), chunk.frame_ms)
            if chunk.finish_reason:
                outcome.finish_reason, outcome.usage = chunk.finish_reason, chunk.usage
        if calls_in is not None:
            await self._wrote(*calls_in.finish(), 0)
            if calls_in.made and (outcome.finish_reason or "stop") == "stop":
                outcome.finish_reason = "tool_calls"
            if self.called:
                self.pipe.tool_calls.inc(len(self.called), tags={"choice": p.turn.tools.choice})
        if p.plan.speak and not self.tokens_to:
            rest = self.chunker.flush() if self.pipe.async_chunk else "".join(self.written)
            if rest and rest.strip():
                await self.pieces.put(rest)

    async def _wrote(self, content: str, calls: list[CallDelta], tokens: int, frame_ms: float = 0.0) -> None:
        # Tokens whose text is empty go out too (as vLLM's server sends them) — but not while calls
        # are being written: their tokens go with the next piece (or the end).
        tokens, self.outcome.unsent = tokens + self.outcome.unsent, 0
        if content or calls or (tokens and self.calls_in is None):
            await self.out.put(Event(text=content, tokens=tokens, calls=tuple(calls), frame_ms=frame_ms))
        elif tokens:
            self.outcome.unsent = tokens
        self.called.update(d.index for d in calls if d.id)
        if calls and self.tokens_to and not self.calling.is_set():
            self.calling.set()  # a token talker would speak the call's tokens: it stops here
        if content:
            self.written.append(content)
            speak = self.p.plan.speak and not self.tokens_to and self.pipe.async_chunk
            if speak and (piece := self.chunker.push(content, tokens)):
                await self.pieces.put(piece)

    # ---- speaking ----------------------------------------------------------------------------

    async def _speak_pieces(self) -> None:
        """A text talker: one call per piece of the answer, as each closes."""
        p, index = self.p, 0
        while (piece := await self.pieces.get()) is not None:
            talk = stages_pb2.TalkRequest(ctx=p.ctx, text=piece, voice=p.voice, chunk_index=index)
            index += 1
            # the piece goes with its first audio
            if await self.pipe.speaking.voice(
                p, talk, self.out, functools.partial(next, iter([piece]), None)
            ):
                self.outcome.speech_cut = True
        await self.pipe.speaking.end_speech(p, self.out)

    async def _speak_tokens(self) -> None:
        """A token talker: one call for the whole response, reading the thinker's tokens as decode
        writes them (async chunk) or, without async chunk, once the thinker is done."""
        p = self.p
        if not self.pipe.async_chunk:
            await self.thought.wait()
        ids, placements = expanded_ids(p.prompt)
        talk = stages_pb2.TalkRequest(
            ctx=p.ctx,
            voice=p.voice,
            thinker=stages_pb2.ThinkerOutput(
                prompt_ids=ids,
                media=placements,
                token_stream=self.tokens_to,
                stop_token_ids=sorted(self.stops),
            ),
            seed=p.sampling.seed,
        )
        spoken = 0

        def transcript() -> str | None:  # the text written since the last audio went out
            nonlocal spoken
            new, spoken = "".join(self.written[spoken:]), len(self.written)
            return new or None

        voice = asyncio.create_task(self.pipe.speaking.voice(p, talk, self.out, transcript))
        called = asyncio.create_task(self.calling.wait())
        lead_in = False  # a call came after content, at a marker the talker stops at
        try:
            await asyncio.wait((voice, called), return_when=asyncio.FIRST_COMPLETED)
            lead_in = self.calling.is_set() and self.marked.is_set() and "".join(self.written).strip() != ""
            if lead_in:
                await asyncio.wait((voice,))
        finally:
            called.cancel()
            if not voice.done():
                voice.cancel()
                await asyncio.gather(voice, return_exceptions=True)
        if lead_in or not self.calling.is_set():
            self.outcome.speech_cut = voice.result()
        await self.pipe.speaking.end_speech(p, self.out)
