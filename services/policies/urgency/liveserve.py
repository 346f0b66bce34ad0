"""LiveServe's interaction-aware urgency (DESIGN.md §5).

- U0: the session is playing and its client buffer is at or below `safe_ms`: it runs first, the
  emptiest buffer first (a gap in playback is the worst outcome) — keyed by when it runs dry.
- U1: no first audio yet (a new response, or not a realtime session): by age, oldest first.
- U2: well buffered: refills that are due first, then by β·K·R_occ − α·C_barge, highest first — K
  the request's KV in thousands of tokens, R_occ the pool's occupancy (finishing big holders frees
  memory when it is scarce), C_barge the session's barge-in rate (tokens likely to be thrown away
  are worth less).
  A U2 request is paced (`Pace`) to its session's lead: the time audio takes through decode,
  talker and vocoder, longer under load — the session's reply gap (end of speech → first audio, a
  moving average), at least `lead_ms`. While its generation is more than `hold_ms` + the lead ahead
  of playback — generated tokens × the session's audio per token (measured on its earlier
  responses, else `ms_per_token`) minus what the client has played — it is held back (the pipeline
  holds more in flight when it is slower, so the hold grows with it). A plan releases it when it is
  `resume_ms` below that, so it runs in batches of tokens; or earlier, once back within it, from
  when its client's buffer is projected to be the lead above `safe_ms` (`release_by`), when its
  refill is due. From then on its hold is a piece higher: the audio of the tokens a reply may
  generate before their audio can come (`piece_tokens`: the engine's stream interval, a talker's
  text piece). Without it, a due refill held partway through a piece was let run a token at a time
  as playback caught up, at real time, while no audio of that piece could reach its client, whose
  buffer drained; before `release_by` the buffer is ample, and holding partway through a piece
  costs nothing (a piece more throughout would only waste more at a barge-in). So a refill is under way,
  as U2, before the buffer runs low, rather than coming as U0 and outranking new turns (U1) at every
  stage. Until then (`release_by`) a U2 request also sits the engine's rounds out while a new turn
  of a realtime session (U1 with a view) is in its queues (`yield_to_turns`): the turn's prefill and
  first tokens run in small batches, on the cores the refill would take, which is what its first
  audio waits on; from `release_by` on its refill is due: it goes first among U2 and no longer
  yields (its key changes then without a classification: `Classified.rekey`; a refill after that
  leaves it due until it is classified again: it yields less, never more, and may run up to a piece
  past its hold — until its classification runs out, lead_ms after release_by at most. Classifying
  it at every refill instead would cost the plan half as many classifications again). Never U0 or U1: a
  request whose audio has not started or runs low may need more tokens before any audio comes (a
  text piece waiting for its end), and holding it would stall its own playback for good.
A waiting U0 or U1 request that finds the seats full may preempt a held or U2 one (the scheduler
does it: services/extensions/vllm/scheduler.py).
No view (not a realtime session, or stale telemetry: the board reader drops it) is U1. A U2
request's score (its KV, the pool's occupancy) is as of its last classification: a plan refreshes it
every `refresh_s`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.policies.urgency.base import HELD, NEVER, Candidate, Classified, Pace, UrgencyPolicy


class LiveServeParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    safe_ms: float = Field(default=1500.0, ge=0)
    hold_ms: float = 3000.0
    alpha: float = Field(default=1.0, ge=0)
    beta: float = Field(default=1.0, ge=0)
    # A held request is released when playback has caught up this much below hold_ms (a batch of
    # tokens per release, not one per round).
    resume_ms: float = Field(default=1500.0, ge=0)
    # The lead until a session has measured a longer reply gap (the pipeline's latency).
    lead_ms: float = Field(default=250.0, ge=0)
    # Audio per generated token until a session has measured its own.
    ms_per_token: float = Field(default=150.0, gt=0)
    # Well-buffered requests whose refill is not yet due sit rounds out while a new turn is there.
    yield_to_turns: bool = True

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
    # More audio reaching a well-buffered session's client moves none of what a U2 request was
    # classified on but its switch to U0 and its early release, which only come later than
    # classified (a release early by a refill is still paced by hold_ms).
    refill_free = frozenset({"U2"})
    refreshed = frozenset({"U2"})  # its score: the request's KV and the pool's occupancy

    def __init__(self, params: LiveServeParams, piece_tokens: int = 0):
        self.p, self.piece_tokens = params, piece_tokens
        # U2 keys are (2, 1, ...) until the refill is due (its release_by), (2, 0, ...) from then on
        self.yields_from = (2, 1) if params.yield_to_turns else None

    def classify(self, c: Candidate, now: float, occupancy: float) -> Classified:
        v, p = c.view, self.p
        if v is None or not v.first_audio:  # not a realtime session, stale telemetry, or no audio yet
            return Classified("U1", (1, c.arrival), NEVER, turn=v is not None)  # until its view changes
        # BoardView.buffered_at, inlined (this runs for every classification): the buffer is at or
        # below safe_ms from `to_u0` on (a paused player counts as dry; a view stamped ahead of this
        # clock has drained nothing yet).
        to_u0 = v.at + (v.buffered_ms - p.safe_ms) / 1000 if v.playing else -NEVER
        if now >= to_u0 or v.buffered_ms <= p.safe_ms:
            # Keyed by when the buffer runs (or ran) dry, not by what is left now: the same order
            # (every buffer drains in real time) without drifting.
            dry_ms = v.at * 1000 + (v.buffered_ms if v.playing else 0.0)
            return Classified("U0", (0, dry_ms, c.arrival), NEVER)  # buffers only drain
        # Only a well-buffered request waits: audio is flowing and the client has plenty, so the
        # tokens it still needs (a text piece waiting for its end) cannot stall its own playback.
        # Until it falls to U0 the client plays in real time: played = played_ms + (now − at).
        lead_ms, ms_per_token = max(p.lead_ms, v.reply_gap_ms or 0.0), v.ms_per_token or p.ms_per_token
        hold_ms, release_by = p.hold_ms + lead_ms, to_u0 - lead_ms / 1000
        piece_ms = self.piece_tokens * ms_per_token  # counted from release_by on (Pace.hold_at)
        pace = Pace(ms_per_token, v.played_ms - v.at * 1000, hold_ms, p.resume_ms, release_by, piece_ms)
        score = p.beta * (c.kv_tokens / 1000) * occupancy - p.alpha * v.barge_ins / max(v.responses, 1)
        due = (2, 0, -score, c.arrival)
        if now >= release_by or not p.yield_to_turns:
            return Classified("U2", due, to_u0, pace)
        return Classified("U2", (2, 1, -score, c.arrival), to_u0, pace, rekey=(release_by, due))


PARAMS = LiveServeParams


def create(params: LiveServeParams, piece_tokens: int = 0) -> LiveServe:
    return LiveServe(params, piece_tokens)
