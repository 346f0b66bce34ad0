"""LiveServe's interaction-aware urgency (DESIGN.md §5).

- U0: the session is playing and its client buffer is at or below `safe_ms`: it runs first, the
  emptiest buffer first (a gap in playback is the worst outcome) — keyed by when it runs dry.
- U1: no first audio yet (a new response, or not a realtime session): by age, oldest first.
- U2: well buffered: ordered by β·K·R_occ − α·C_barge, highest first — K the request's KV in
  thousands of tokens, R_occ the pool's occupancy (finishing big holders frees memory when it is
  scarce), C_barge the session's barge-in rate (tokens likely to be thrown away are worth less).
  A U2 request whose generation is more than `hold_ms` ahead of playback — generated tokens × the
  session's audio per token (measured on its earlier responses, else `ms_per_token`) minus what the
  client has played — is held back, until playback is `resume_ms` below `hold_ms` (or its view
  changes) when it is classified again: a held request runs in batches of tokens. Never U0 or U1: a request whose audio has not started
  or runs low may need more tokens before any audio comes (a text piece waiting for its end), and
  holding it would stall its own playback for good.
A waiting U0 or U1 request that finds the seats full may preempt a held or U2 one (the scheduler
does it: services/extensions/vllm/scheduler.py).
No view (not a realtime session, or stale telemetry: the board reader drops it) is U1. A U2
request's score (its KV, the pool's occupancy) is as of its last classification: a plan refreshes it
every `refresh_s`.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.playback.board import BoardView
from services.policies.urgency.base import HELD, NEVER, Candidate, Classified, UrgencyPolicy


class LiveServeParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    safe_ms: float = Field(default=1500.0, ge=0)
    hold_ms: float = 3000.0
    alpha: float = Field(default=1.0, ge=0)
    beta: float = Field(default=1.0, ge=0)
    # A held request is released when playback has caught up this much below hold_ms (a batch of
    # tokens per release, not one per round).
    resume_ms: float = Field(default=1500.0, ge=0)
    # Audio per generated token until a session has measured its own.
    ms_per_token: float = Field(default=150.0, gt=0)

    @model_validator(mode="after")
    def _hold_after_safe(self):
        if self.hold_ms <= self.safe_ms:
            raise ValueError("need safe_ms < hold_ms")
        if self.resume_ms >= self.hold_ms:
            raise ValueError("need resume_ms < hold_ms")
        return self


class LiveServe(UrgencyPolicy):
    name = "liveserve"

    preemptible = frozenset({"U2", HELD})

    def __init__(self, params: LiveServeParams):
        self.p = params

    def keeps(self, c: Classified, old: BoardView | None, new: BoardView | None) -> bool:
        # More audio reaching a well-buffered session's client moves none of what a U2 or held
        # request was classified on but its switch to U0, which only comes later.
        return c.cls in ("U2", HELD) and old is not None and new is not None and old.refilled(new)

    def classify(self, c: Candidate, now: float, occupancy: float) -> Classified:
        v, p = c.view, self.p
        if v is None or not v.first_audio:  # not a realtime session, stale telemetry, or no audio yet
            return Classified("U1", (1, c.arrival), NEVER, NEVER)  # until its view changes
        # BoardView.buffered_at / played_at, inlined: this runs for every classification.
        drained = max(0.0, now - v.at) * 1000
        buffered = max(0.0, v.buffered_ms - drained) if v.playing else 0.0
        if buffered <= p.safe_ms:
            # Keyed by when the buffer runs (or ran) dry, not by what is left now: the same order
            # (every buffer drains in real time) without drifting; a paused player counts as dry.
            dry_ms = v.at * 1000 + (v.buffered_ms if v.playing else 0.0)
            return Classified("U0", (0, dry_ms, c.arrival), NEVER, NEVER)  # buffers only drain
        # Only a well-buffered request waits: audio is flowing and the client has plenty, so the
        # tokens it still needs (a text piece waiting for its end) cannot stall its own playback.
        to_u0 = v.at + (v.buffered_ms - p.safe_ms) / 1000
        ms_per_token = v.ms_per_token or p.ms_per_token
        ahead = c.generated * ms_per_token - (v.played_ms + drained)  # playing: played_at(now)
        if ahead > p.hold_ms:  # held, it generates nothing: playback catches up in real time
            release = now + (ahead - p.hold_ms + p.resume_ms) / 1000
            return Classified(HELD, (3, c.arrival), min(to_u0, release), NEVER)
        score = p.beta * (c.kv_tokens / 1000) * occupancy - p.alpha * v.barge_ins / max(v.responses, 1)
        tokens = math.floor((p.hold_ms - ahead) / ms_per_token) + 1  # then it may be held
        return Classified("U2", (2, -score, c.arrival), to_u0, tokens)


PARAMS = LiveServeParams


def create(params: LiveServeParams) -> LiveServe:
    return LiveServe(params)
