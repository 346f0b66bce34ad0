"""LiveServe's interaction-aware urgency (DESIGN.md §5).

- U0: the session is playing and its client buffer is at or below `safe_ms`: it runs first, the
  emptiest buffer first (a gap in playback is the worst outcome).
- U1: no first audio yet (a new response, or not a realtime session): by age, oldest first.
- U2: well buffered: ordered by β·K·R_occ − α·C_barge, highest first — K the request's KV in
  thousands of tokens, R_occ the pool's occupancy (finishing big holders frees memory when it is
  scarce), C_barge the session's barge-in rate (tokens likely to be thrown away are worth less).
  A U2 request whose generation is more than `hold_ms` ahead of playback — generated tokens × the
  session's audio per token (measured on its earlier responses, else `ms_per_token`) minus what the
  client has played — is held back this round. Never U0 or U1: a request whose audio has not started
  or runs low may need more tokens before any audio comes (a text piece waiting for its end), and
  holding it would stall its own playback for good.
A view older than `stale_s` counts as no telemetry (U1).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.policies.urgency.base import Candidate, Ranking


class LiveServeParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    safe_ms: float = Field(default=1500.0, ge=0)
    hold_ms: float = 3000.0
    alpha: float = Field(default=1.0, ge=0)
    beta: float = Field(default=1.0, ge=0)
    stale_s: float = Field(default=2.0, gt=0)
    # Audio per generated token until a session has measured its own.
    ms_per_token: float = Field(default=150.0, gt=0)

    @model_validator(mode="after")
    def _hold_after_safe(self):
        if self.hold_ms <= self.safe_ms:
            raise ValueError("need safe_ms < hold_ms")
        return self


class LiveServe:
    name = "liveserve"

    def __init__(self, params: LiveServeParams):
        self.p = params

    def classify(self, c: Candidate, now: float, occupancy: float) -> tuple[str, tuple]:
        v = c.view
        if v is None or not v.fresh(now, self.p.stale_s):
            return "U1", (1, c.arrival)
        if not v.first_audio:
            return "U1", (1, c.arrival)
        buffered = v.buffered_at(now)
        if buffered <= self.p.safe_ms:
            return "U0", (0, buffered, c.arrival)
        # Only a well-buffered request waits: audio is flowing and the client has plenty, so the
        # tokens it still needs (a text piece waiting for its end) cannot stall its own playback.
        ahead = c.generated * (v.ms_per_token or self.p.ms_per_token) - v.played_at(now)
        if ahead > self.p.hold_ms:
            return "held", (3, c.arrival)
        barge = v.barge_ins / max(v.responses, 1)
        score = self.p.beta * (c.kv_tokens / 1000) * occupancy - self.p.alpha * barge
        return "U2", (2, -score, c.arrival)

    def rank(self, candidates: list[Candidate], now: float, occupancy: float) -> Ranking:
        keyed = [self.classify(c, now, occupancy) for c in candidates]
        classes = [k[0] for k in keyed]
        order = sorted((i for i, k in enumerate(classes) if k != "held"), key=lambda i: keyed[i][1])
        held = [i for i, k in enumerate(classes) if k == "held"]
        return Ranking(order, held, classes)


PARAMS = LiveServeParams


def create(params: LiveServeParams) -> LiveServe:
    return LiveServe(params)
