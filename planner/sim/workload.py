"""What the simulated users do, as loadtest/ and WORKLOADS.md define it: realtime voice sessions
(speech, a reply heard at real time, a reply gap, barge-ins with probability p at LiveServe's cut
point), text chat, image chat and documents (tiles through the encoder pool), from several tenants;
sessions and requests arrive Poisson or in bursts (BurstGPT's shape: gamma inter-arrivals with a
coefficient of variation above 1 — its traces fit a gamma of shape well below 1).
"""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loadtest.clients.workload import REPLY_TOKENS
from services.quota.tenants import TenantSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Arrivals(_Strict):
    kind: Literal["poisson", "bursty"] = "poisson"
    burst_cv: float = Field(default=3.0, gt=1)  # bursty: the inter-arrivals' coefficient of variation

    def gaps(self, rate: float, rng: random.Random):
        """Inter-arrival times at a mean of `rate` per second."""
        if self.kind == "poisson":
            while True:
                yield rng.expovariate(rate)
        shape = 1 / self.burst_cv**2  # a gamma's CV is 1/sqrt(shape); its mean is shape * scale
        while True:
            yield rng.gammavariate(shape, 1 / (shape * rate))


class VoiceSpec(_Strict):
    sessions: int = Field(default=0, ge=0)  # concurrent voice sessions (each one user, turn after turn)
    start_s: float = Field(default=0.0, ge=0)  # the first opens then (a load step)
    ramp_s: float = Field(default=5.0, ge=0)  # sessions open spread over this long
    barge_p: float = Field(default=0.0, ge=0, le=1)  # each reply is talked over with this probability
    reply_tokens: tuple[int, int] = REPLY_TOKENS  # log-uniform
    speech_s: tuple[float, float] = (1.0, 4.0)  # the user's turn, uniform
    gap_s: tuple[float, float] = (0.5, 3.0)  # after playback ends, before the user speaks again
    audio_tokens_per_s: float = Field(default=12.5, gt=0)  # the audio encoder's tokens per speech second
    system_tokens: int = Field(default=256, ge=1)  # the conversation's start
    context_tokens: int = Field(default=16384, ge=256)  # the conversation window: older turns drop out
    ms_per_token: float = Field(default=150.0, gt=0)  # audio per reply token
    # a text talker's pieces (planner/sim/speech.py TextTalkerReplica): a reply token ends a clause
    # with this probability (prose: about one in ten; a random-weight thinker: its vocabulary's share)
    clause_p: float = Field(default=0.1, ge=0, le=1)
    chars_per_token: float = Field(default=4.0, gt=0)  # of a reply's text (the talker's units follow)
    vad_silence_s: float = Field(default=0.3, ge=0)  # silence before server VAD ends a turn (not in TTFP)
    # A session's turns (None: it talks until the run ends); its last reply is heard whole. With
    # turns, sessions come in `blocks` of `sessions` fresh ones, each block once the last has ended
    # (make bench-voice's cells), and the run ends with the last block.
    turns: int | None = Field(default=None, ge=1)
    blocks: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _blocks_need_turns(self):
        if self.blocks > 1 and self.turns is None:
            raise ValueError("voice blocks follow each other once their sessions' turns are done: give turns")
        return self


class RequestSpec(_Strict):
    """A stream of independent requests: text chat (`tiles` 0), image chat or documents."""

    rate: float = Field(default=0.0, ge=0)  # per second
    prompt_tokens: tuple[int, int] = (20, 2000)  # log-normal median of the pair's geometric mean, clipped
    output_tokens: tuple[int, int] = (30, 300)  # log-uniform
    tiles: tuple[int, int] = (0, 0)  # image tiles per request, uniform
    tokens_per_tile: int = Field(default=256, ge=1)
    arrivals: Arrivals = Arrivals()
    slo_class: Literal["interactive", "batch"] = "interactive"  # over quota: refused, or waits
    start_s: float = Field(default=0.0, ge=0)  # arrivals from then (a load step)
    stop_s: float | None = None  # and until then (None: the run's end)

    def prompt(self, rng: random.Random) -> int:
        lo, hi = self.prompt_tokens
        return int(min(hi, max(lo, rng.lognormvariate(math.log(math.sqrt(lo * hi)), 0.6))))

    def output(self, rng: random.Random) -> int:
        lo, hi = self.output_tokens
        return min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))


CLOSED_LOOP = "closed_loop"  # its requests' class name in the reports


class ClosedLoop(_Strict):
    """`concurrency` clients sending `requests` back to back, each its next as soon as its last one
    ended, as `make bench` does (loadtest/clients/client.py `run_closed_loop`)."""

    concurrency: int = Field(ge=1)
    requests: list[tuple[int, int]]  # (prompt tokens, output tokens), in the order sent


class Workload(_Strict):
    voice: VoiceSpec = VoiceSpec()
    requests: dict[str, RequestSpec] = Field(
        default_factory=dict
    )  # class name (chat, image, document) -> spec
    closed_loop: ClosedLoop | None = None
    tenants: int = Field(default=1, ge=1)  # sessions and requests spread over this many tenants
    # Every tenant's quota (its id aside); None: unmetered. Needs a Redis for the buckets (Cluster).
    quota: TenantSpec | None = None
    duration_s: float = Field(default=120.0, gt=0)
    warmup_s: float = Field(default=10.0, ge=0)  # what ends before this is not counted
    seed: int = 0
