"""What an urgency policy sees and returns. A policy classifies one request at a time from its
session's board view; it never does I/O. Whole rankings (`UrgencyPolicy.rank`) and the engine
scheduler's incremental plan (services/policies/urgency/plan.py) are built from `classify`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from services.playback.board import BoardView

HELD = "held"  # the class of a request not to run this round
NEVER = math.inf


class Candidate(NamedTuple):  # a tuple: built for every classified request
    arrival: float  # when the request arrived (engine clock); FCFS order
    kv_tokens: int  # tokens whose KV the request holds
    generated: int  # output tokens generated so far
    view: BoardView | None  # its session's view; None: not a realtime session, or no telemetry


class Classified(NamedTuple):
    cls: str  # urgency class (metrics; HELD: sits this round out)
    key: tuple  # sort key, most urgent lowest; the same for the same request and view at any later time
    until: float  # wall time (time.time()) from which the class or key may differ: classify again
    tokens: float  # generated tokens after which it may differ (NEVER: time or a new view only)


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

    def classify(self, c: Candidate, now: float, occupancy: float) -> Classified:
        raise NotImplementedError

    def keeps(self, c: Classified, old: BoardView | None, new: BoardView | None) -> bool:
        """Whether `c`, classified on view `old`, still holds (class, key, and no later deadlines)
        on `new`: then a plan does not classify the request again. False unless a policy knows."""
        return False

    def rank(self, candidates: list[Candidate], now: float, occupancy: float) -> Ranking:
        keyed = [self.classify(c, now, occupancy) for c in candidates]
        order = sorted((i for i, k in enumerate(keyed) if k.cls != HELD), key=lambda i: keyed[i].key)
        held = [i for i, k in enumerate(keyed) if k.cls == HELD]
        return Ranking(order, held, [k.cls for k in keyed])
