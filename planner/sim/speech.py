"""The speech stages on the simulated clock. A token talker (Qwen3-Omni's) batches streams — each
step makes one codec frame for each of up to `max_streams` streams, the most urgent first by the
speech stages' own ordering (`most_urgent_first`, services/stages/urgency_gate.py, with the
deployment's urgency policy and the session board) — and the vocoder is the delay its batch curve
gives: a reply token's audio reaches the client when its frames are made and vocoded. A text talker
(`tiny`'s and `small`'s) voices text pieces, cut from the reply as the gateway's TextChunker cuts
them: a piece's tokens reach the client together, once it is cut, talked and vocoded.
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Callable

import simpy

from planner.costs import StageCosts
from planner.sim.cores import SharedCores, work
from services.policies.urgency.base import UrgencyPolicy
from services.stages.urgency_gate import most_urgent_first

CODEC_FRAME_MS = 80.0  # Qwen3-Omni's talker: 12.5 codec frames a second of speech


class _Stream:
    __slots__ = ("sid", "arrival", "frames", "tokens")

    def __init__(self, sid: str, arrival: float):
        self.sid, self.arrival = sid, arrival
        self.frames = 0  # frames left of the token at the head
        self.tokens: collections.deque = collections.deque()  # (frames, callback) per token


class TalkerReplica:
    def __init__(self, env: simpy.Environment, name: str, costs: StageCosts, policy: UrgencyPolicy,
                 views: Callable[[], dict], max_streams: int, frames_per_token: int):  # fmt: skip
        self.env, self.name, self.costs, self.policy, self.views = env, name, costs, policy, views
        self.max_streams, self.frames_per_token = max_streams, frames_per_token
        self.streams: dict[str, _Stream] = {}
        self.steps = self.busy_s = 0.0
        self._wake = env.event()
        env.process(self._loop())

    def token(self, sid: str, audio: Callable[[], None]) -> None:
        """One more reply token of `sid`: `audio()` when its audio reaches the client."""
        stream = self.streams.get(sid)
        if stream is None:
            stream = self.streams[sid] = _Stream(sid, self.env.now)
        stream.tokens.append(audio)
        if not stream.frames:
            stream.frames = self.frames_per_token
        if not self._wake.triggered:
            self._wake.succeed()

    def drop(self, sid: str) -> None:
        """The reply was cut: what it had not voiced is never made."""
        self.streams.pop(sid, None)

    def end(self, sid: str) -> None:
        """The reply's last token was given (a token talker has nothing held back)."""

    def _loop(self):
        env, c = self.env, self.costs
        while True:
            if not self.streams:
                self._wake = env.event()
                yield self._wake
                continue
            waiting = list(self.streams.values())
            if len(waiting) > self.max_streams:
                order = most_urgent_first(
                    self.policy, self.views(), [(s.arrival, s.sid) for s in waiting], env.now
                )
                waiting = [waiting[i] for i in order[: self.max_streams]]
            cost = c.talker_step.at(len(waiting)) if c.talker_step is not None else 0.0
            yield env.timeout(cost)
            self.steps += 1
            self.busy_s += cost
            vocoder = c.vocoder_batch.at(len(waiting)) if c.vocoder_batch is not None else 0.0
            for s in waiting:
                if self.streams.get(s.sid) is not s:
                    continue  # cut during the step
                s.frames -= 1
                if s.frames:
                    continue
                env.timeout(vocoder).callbacks.append(_call(s.tokens.popleft()))
                if s.tokens:
                    s.frames = self.frames_per_token
                else:
                    del self.streams[s.sid]


class TextTalkerReplica:
    """A text talker and its vocoder: each reply's tokens are cut into pieces as the gateway's
    TextChunker cuts them (a piece closes at a clause boundary once it holds `min_tokens`, or at
    `max_tokens`; a token ends a clause with probability `clause_p`; the chunker sees the tokens
    `every` at a time, as the engine streams them), and the reply's last piece at its end. A
    reply's pieces are voiced in order, one at a time (the gateway's one talker stream per piece):
    the talker's units for the piece's text (`talker_units`), then its vocoder chunks
    (`vocoder_batch` of one), on the machine's cores where they are shared."""

    def __init__(self, env: simpy.Environment, name: str, costs: StageCosts, cores: SharedCores | None,
                 chunking: tuple[int, int], clause_p: float, units_per_token: float, chunk_units: int,
                 rng: random.Random, every: int = 1, speech_token_cpu_s: float = 0.0):  # fmt: skip
        self.env, self.name, self.costs, self.cores = env, name, costs, cores
        self.speech_token_cpu_s = speech_token_cpu_s  # Serving's: the speech path beyond the model steps
        (self.min_tokens, self.max_tokens), self.clause_p = chunking, clause_p
        self.units_per_token, self.chunk_units = units_per_token, chunk_units
        self.rng, self.every = rng, every
        self.streams: dict[str, _Reply] = {}
        self.busy_s = 0.0

    def token(self, sid: str, audio: Callable[[], None]) -> None:
        reply = self.streams.get(sid)
        if reply is None:
            reply = self.streams[sid] = _Reply(self.env.event())
            self.env.process(self._voice(sid, reply))
        reply.open.append(audio)
        n = len(reply.open)
        reply.given += 1
        if reply.given % self.every:
            return  # the chunker has not seen it yet
        if n >= self.max_tokens or (n >= self.min_tokens and self.rng.random() < self.clause_p):
            self._close(reply)

    def end(self, sid: str) -> None:
        if (reply := self.streams.get(sid)) is not None:
            if reply.open:
                self._close(reply)
            reply.ended = True
            self._wake(reply)

    def drop(self, sid: str) -> None:
        self.streams.pop(sid, None)

    def _close(self, reply: _Reply) -> None:
        reply.pieces.append(reply.open)
        reply.open = []
        self._wake(reply)

    @staticmethod
    def _wake(reply: _Reply) -> None:
        if not reply.ready.triggered:
            reply.ready.succeed()

    def _voice(self, sid: str, reply: _Reply):
        c = self.costs
        while self.streams.get(sid) is reply:
            if not reply.pieces:
                if reply.ended:
                    del self.streams[sid]
                    return
                reply.ready = self.env.event()
                yield reply.ready
                continue
            piece = reply.pieces.popleft()
            cost = piece_steps_s(c, len(piece) * self.units_per_token, self.chunk_units)
            cost += len(piece) * self.speech_token_cpu_s
            yield work(self.env, self.cores, cost)
            self.busy_s += cost
            if self.streams.get(sid) is reply:  # else cut while it was voiced
                for audio in piece:
                    audio()


def piece_steps_s(costs: StageCosts, units: float, chunk_units: int) -> float:
    """The talker's and vocoder's model steps for a text piece of `units` speech units: the talker's
    units, then its vocoder chunks of `chunk_units`, one at a time."""
    s = costs.talker_units.at(units) if costs.talker_units is not None else 0.0
    if costs.vocoder_batch is not None:
        s += math.ceil(units / chunk_units) * costs.vocoder_batch.at(1)
    return s


class _Reply:
    __slots__ = ("ready", "open", "pieces", "ended", "given")

    def __init__(self, ready: simpy.Event):
        self.ready = ready  # a piece to voice, or the end
        self.open: list = []  # the tokens of the piece not yet closed
        self.pieces: collections.deque = collections.deque()  # closed, not yet voiced
        self.ended = False
        self.given = 0  # tokens of the reply so far


def _call(audio: Callable[[], None]):
    return lambda _: audio()


def frames_per_token(ms_per_token: float) -> int:
    return math.ceil(ms_per_token / CODEC_FRAME_MS)
