"""One long-lived vLLM request per realtime session on a bounded-KV decode engine (Metronome's
session KV): each turn appends only what is new to the session's streaming-input request
(`AsyncLLM.generate()` over an async generator of `StreamingInput`), so the turn computes its new
tokens only and the request's KV stays within the engine's sinks + window
(services/extensions/vllm/sink_window.py) however long the conversation grows.

A turn brings the whole prompt, as for any decode (the pipeline renders the conversation). The
session's request continues when that prompt starts with what the request has seen: the previous
turn's prompt, then its reply — as the model wrote it, or other ids that spell the same text (the
history renders the reply's text, which does not always tokenize back to the model's ids; the
engine keeps the model's own) — but the reply's last sampled token, which vLLM never feeds back
(the history renders it again, and it comes with the appended part). Otherwise — history edited or
truncated (a barge-in cuts the reply to what was heard), a reply rendered to other text, a request
that would pass `max_model_len`, a session not seen (or closed) on this replica —
the request is closed and a new one starts from the sinks and the last window of the prompt
(StreamingLLM's cache: the engine attends to nothing else anyway), so a restart costs at most
sinks + window tokens. A turn whose consumer goes away (barge-in, client gone) ends the request:
vLLM has no way to stop one turn of a streaming request and keep it.

Requests idle for `idle_s` are closed (a task on the replica's event loop looks every
`min(idle_s / 2, REAP_EVERY_S)`, whether turns come or not), and at most `max_sessions` are kept
(least recently used closed first): each holds a seat and its bounded blocks while it waits for the
next turn.

vLLM 0.32 constraints: streaming input takes token ids only (no prompt embeddings: a turn whose
prompt carries encoder output is a one-off request, as without session KV), no stop strings, no
n > 1. The caller (services/engine/thinker.py) sends only eligible turns here.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from services.extensions.ray.metrics import metric
from services.models.profile import SessionKvSpec

OUTCOMES = ("appended", "started", "restarted", "one_off")
# vLLM's finishes of a request it gave up on rather than ended (vllm.v1.engine.FINISH_REASON_STRINGS):
# `error`, a retryable request-level failure (a KV load; vLLM's own server answers it with a 500),
# and `abort`, the request ended by someone other than its reader. Neither is an answer's end.
GAVE_UP = frozenset({"error", "abort"})
# A reply's text tokenized again differs from the model's ids by merges and splits: its length is
# searched this many tokens either side.
RETOKENIZED_SLACK = 8
REAP_EVERY_S = 10.0  # the longest between looks for idle requests


def export_metrics() -> tuple[Any, Any]:
    """The session KV metrics (turns by outcome, open requests), zeroed: a decode replica without
    session KV shows zeros."""
    turns, open_ = (
        metric("omniray_engine_session_kv_turns_total", outcome=OUTCOMES),
        metric("omniray_engine_session_kv_requests"),
    )
    return turns, open_


@dataclass
class _Live:
    inputs: asyncio.Queue  # StreamingInput for the request's input stream
    outputs: Any  # the request's output stream (AsyncLLM.generate's async generator)
    prompt: list[int]  # the last turn's prompt (as the pipeline rendered it)
    kept: list[int]  # its reply as the engine holds it: all but the last sampled token
    length: int  # tokens in the engine's request (its positions)
    used: float
    busy: bool = field(default=False)


class SessionKv:
    """The decode engine's long-lived session requests (one per session id, this replica)."""

    def __init__(self, engine: Any, spec: SessionKvSpec, sinks: int, window: int, max_model_len: int,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.engine, self.spec, self.clock = engine, spec, clock
        self.sinks, self.window, self.max_model_len = sinks, window, max_model_len
        self._live: OrderedDict[str, _Live] = OrderedDict()  # least recently used first
        self.outcomes: Counter[str] = Counter()  # turns by outcome (OUTCOMES), this process
        self._turns, self._open = export_metrics()
        self._reaper: asyncio.Task | None = None  # started by the first turn, on the replica's loop

    def requests(self) -> int:
        """Long-lived session requests open."""
        return len(self._live)

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self._turns.inc(tags={"outcome": outcome})

    async def turn(self, session_id: str, ids: list[int], params: Any, request_id: str) -> AsyncIterator[Any]:
        """The turn's outputs (DELTA RequestOutputs; the last one says `finished`)."""
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap())
        live = self._live.get(session_id)
        appended = None if live is None or live.busy else self._appended(live, ids, params)
        if appended is not None:
            self._count("appended")
        elif (live is not None and live.busy) or not await self._make_room(session_id):
            # a second response of one session at once, or every kept request in a turn: its own
            # request, as without session KV
            self._count("one_off")
            async for out in self.engine.generate(
                {"prompt_token_ids": list(ids)}, params, request_id=request_id
            ):
                yield out
            return
        else:
            self._count("started" if live is None else "restarted")
            live, appended = self._start(session_id, ids, request_id)
        from vllm.engine.protocol import StreamingInput

        live.busy, live.used = True, self.clock()
        self._live.move_to_end(session_id)
        # vLLM extends the first chunk's list in place: hand it copies
        await live.inputs.put(
            StreamingInput(prompt={"prompt_token_ids": list(appended)}, sampling_params=params)
        )
        reply: list[int] = []
        ended = False  # the turn answered, the request goes on: it is kept
        try:
            async for out in live.outputs:
                c = out.outputs[0]
                reply.extend(c.token_ids)
                finish = c.finish_reason
                if finish is not None:
                    out.finished = True  # this turn's last output
                    ended = finish not in GAVE_UP  # given up: the request is gone
                yield out
                if finish is not None:
                    break
        finally:
            live.busy = False
            if ended:
                live.prompt, live.kept = list(ids), reply[:-1]
                live.length += len(appended) + max(len(reply) - 1, 0)
                live.used = self.clock()
            else:  # the consumer went away mid-turn, or the request ended or was given up: none to keep
                await self._close(session_id)

    def _appended(self, live: _Live, ids: list[int], params: Any) -> list[int] | None:
        """The tokens to append to the session's request, or None: start a new one."""
        n = len(live.prompt)
        if ids[:n] != live.prompt:
            return None
        rest = ids[n:]
        k = self._spelled(live.kept, rest)
        if k is None or k == len(rest):
            return None
        appended = rest[k:]
        if live.length + len(appended) + params.max_tokens > self.max_model_len:
            return None  # positions would run past the model's length: start again, windowed
        return appended

    def _spelled(self, kept: list[int], rest: list[int]) -> int | None:
        """How many tokens of `rest` are the reply the engine holds: the same ids, or other ids
        that spell the same text (the history renders the reply's text, which does not always
        tokenize back to the ids the model wrote); None: the reply is not there as written."""
        if rest[: len(kept)] == kept:
            return len(kept)
        decode = self.engine.tokenizer.decode
        text = decode(kept)
        for k in range(
            max(0, len(kept) - RETOKENIZED_SLACK), min(len(rest), len(kept) + RETOKENIZED_SLACK) + 1
        ):
            if decode(rest[:k]) == text:
                return k
        return None

    async def _make_room(self, session_id: str) -> bool:
        """Close the session's request, then the least recently used idle ones over the limit;
        whether a new request of the session fits (not when another turn of it started one while
        these closed)."""
        await self._close(session_id)
        idle = (s for s, live in list(self._live.items()) if not live.busy)
        while len(self._live) >= self.spec.max_sessions and (oldest := next(idle, None)) is not None:
            await self._close(oldest)
        return len(self._live) < self.spec.max_sessions and session_id not in self._live

    def _start(self, session_id: str, ids: list[int], request_id: str) -> tuple[_Live, list[int]]:
        # the sinks and the last window of the prompt: what the engine would attend to anyway
        start = ids if len(ids) <= self.sinks + self.window else ids[: self.sinks] + ids[-self.window :]
        inputs: asyncio.Queue = asyncio.Queue()

        async def stream():  # ends when vLLM cancels it (the request aborted)
            while True:
                yield await inputs.get()

        request_id = f"{request_id}-session"
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # the request's own params (each turn brings its own with its input)
        base = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.DELTA)
        outputs = self.engine.generate(stream(), base, request_id=request_id)
        live = _Live(inputs, outputs, prompt=[], kept=[], length=0, used=self.clock())
        self._live[session_id] = live
        self._open.set(len(self._live))
        return live, start

    async def _close(self, session_id: str) -> None:
        live = self._live.pop(session_id, None)
        self._open.set(len(self._live))
        if live is not None:
            await live.outputs.aclose()  # vLLM aborts the request and cancels its input stream

    async def _reap(self) -> None:
        """Close the requests no turn used for `idle_s`, every min(idle_s / 2, REAP_EVERY_S)."""
        while True:
            await asyncio.sleep(min(self.spec.idle_s / 2, REAP_EVERY_S))
            cutoff = self.clock() - self.spec.idle_s
            for session_id in [s for s, live in self._live.items() if not live.busy and live.used < cutoff]:
                await self._close(session_id)

    def stop(self) -> None:
        """The engine shuts down (its requests with it): no more looks for idle ones."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None

    async def close_all(self) -> None:
        for session_id in list(self._live):
            await self._close(session_id)
