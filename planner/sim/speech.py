"""The speech stages on the simulated clock: a talker replica that batches streams — each step makes
one codec frame for each of up to `max_streams` streams, the most urgent first by the speech stages'
own ordering (`most_urgent_first`, services/stages/urgency_gate.py, with the deployment's urgency
policy and the session board) — and the vocoder as the delay its batch curve gives. A reply token's
audio reaches the client when its frames are made and vocoded.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable

import simpy

from planner.costs import StageCosts
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


def _call(audio: Callable[[], None]):
    return lambda _: audio()


def frames_per_token(ms_per_token: float) -> int:
    return math.ceil(ms_per_token / CODEC_FRAME_MS)
