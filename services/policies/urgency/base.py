"""What an urgency policy sees and returns. A policy classifies one request at a time from its
session's board view; it never does I/O. Whole rankings (`UrgencyPolicy.rank`) and the engine
scheduler's incremental plan (services/policies/urgency/plan.py) are built from `classify`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from services.playback.board import BoardView

HELD = "held"  # the class of a paced request not to run this round
NEVER = math.inf
PLAYBACK_CREDIT = 0.25  # Pace.rounds_to_hold


class Candidate(NamedTuple):  # a tuple: built for every classified request
    arrival: float  # when the request arrived (engine clock); FCFS order
    kv_tokens: int  # tokens whose KV the request holds
    generated: int  # output tokens generated so far
    view: BoardView | None  # its session's view; None: not a realtime session, or no telemetry


class Pace(NamedTuple):
    """Generation paced to playback. `ahead` = generated tokens × `ms_per_token` − what the client has
    played (`origin_ms` + now × 1000: it plays in real time). More than `hold_ms` ahead, the request
    is held (sits rounds out). A plan releases it when it is `resume_ms` below `hold_ms`, so it runs
    in batches of tokens rather than one per round — or earlier, from `release_by` (wall time) on, as
    soon as it is back within its hold: its client's buffer is then about to run low, and a refill
    must be on its way before it does. From `release_by` on the hold is `piece_ms` higher: a refill
    that is due must be able to finish the piece it is in (the pipeline's granularity: no audio of
    a piece comes before its last token), where before then the buffer is ample and holding it
    partway through a piece costs nothing but waste at a barge-in."""

    ms_per_token: float
    origin_ms: float
    hold_ms: float
    resume_ms: float
    release_by: float = NEVER
    piece_ms: float = 0.0

    def hold_at(self, now: float) -> float:
        return self.hold_ms + self.piece_ms if now >= self.release_by else self.hold_ms

    def ahead(self, generated: int, now: float) -> float:
        return generated * self.ms_per_token - self.origin_ms - now * 1000

    def holds(self, generated: int, now: float) -> bool:
        return self.ahead(generated, now) > self.hold_at(now)

    def release_at(self, ahead: float, now: float) -> float:
        """When a request held at `now`, `ahead`, is released (it generates nothing meanwhile;
        playback catches up in real time)."""
        batch = now + (ahead - self.hold_ms + self.resume_ms) / 1000
        return min(batch, max(self.release_by, now + (ahead - self.hold_ms - self.piece_ms) / 1000))

    def rounds_to_hold(self, ahead: float, now: float, tokens_per_round: int, round_s: float) -> int:
        """Rounds after which a running request `ahead` at `now` may be over its hold, if it generates at
        most `tokens_per_round` a round and playback moves on at least `round_s` a round (at
        least 1). Playback counts for at most PLAYBACK_CREDIT of what the tokens gain: should
        rounds get much shorter than `round_s`, the request is held at most that share of the
        way late (a third of `hold_ms` − `ahead` of audio, were rounds to take no time at all)."""
        gain = tokens_per_round * self.ms_per_token
        gain -= min(round_s * 1000, gain * PLAYBACK_CREDIT)
        return max(1, math.floor((self.hold_at(now) - ahead) / gain) + 1)


class Classified(NamedTuple):
    cls: str  # urgency class (metrics)
    key: tuple  # sort key, most urgent lowest; the same for the same request and view at any later time
    until: float  # wall time (time.time()) from which the class or key may differ: classify again
    pace: Pace | None = None  # paced to playback: held (class HELD) while over its hold
    turn: bool = False  # a realtime turn before its first audio: what `UrgencyPolicy.yields_from` yields to
    # (wall time, key): from then on the request is keyed so, without a classification — a key that
    # changes at a known time and reads nothing new (a yield running out: `UrgencyPolicy.yields_from`)
    rekey: tuple[float, tuple] | None = None


@dataclass(frozen=True)
class Ranking:
    order: list[int]  # candidate indexes, most urgent first
    held: list[int]  # candidates not to run this round (far ahead of playback)
    classes: list[str]  # urgency class of each candidate (metrics)


class UrgencyPolicy:
    """A policy implements `classify`; a key must not drift with time between `until`s, so a plan
    can keep it (the order of two requests only changes when one of them is classified again)."""

    name: str
    preemptible: frozenset[str]  # classes whose requests a waiting request of another class may preempt
    # Classes a new view of the session cannot change (a plan does not classify them again for it):
    # any new view, or one that only says more audio reached the client (BoardView.refilled).
    view_free: frozenset[str] = frozenset()
    refill_free: frozenset[str] = frozenset()
    # Classes whose keys read what no view change tells of (a request's KV, the pool's occupancy): a
    # plan classifies their requests again every `refresh_s`; the others only on a view or `until`.
    refreshed: frozenset[str] = frozenset()
    # Requests keyed at or above this sit rounds out while a turn (`Classified.turn`) is in the
    # engine's queues, so that the turn's steps are short (a `Classified.rekey` below it ends the
    # yield); they are the end of the order. None: nothing yields.
    yields_from: tuple | None = None

    def classify(self, c: Candidate, now: float, occupancy: float) -> Classified:
        raise NotImplementedError

    def rank(self, candidates: list[Candidate], now: float, occupancy: float) -> Ranking:
        keyed = [self.classify(c, now, occupancy) for c in candidates]
        classes = [
            HELD if k.pace is not None and k.pace.holds(c.generated, now) else k.cls
            for c, k in zip(candidates, keyed, strict=True)
        ]
        order = sorted((i for i, cls in enumerate(classes) if cls != HELD), key=lambda i: keyed[i].key)
        held = [i for i, cls in enumerate(classes) if cls == HELD]
        return Ranking(order, held, classes)
