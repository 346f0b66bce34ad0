"""What an urgency policy sees and returns. A policy ranks the engine's running requests once per
scheduling round from the session board; it never does I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from services.playback.board import BoardView


class Candidate(NamedTuple):  # a tuple: built for every running request every round
    arrival: float  # when the request arrived (engine clock); FCFS order
    kv_tokens: int  # tokens whose KV the request holds
    generated: int  # output tokens generated so far
    view: BoardView | None  # its session's view; None: not a realtime session, or no telemetry


@dataclass(frozen=True)
class Ranking:
    order: list[int]  # candidate indexes, most urgent first
    held: list[int]  # candidates not to run this round (far ahead of playback)
    classes: list[str]  # urgency class of each candidate (metrics)


class UrgencyPolicy(Protocol):
    name: str

    def rank(self, candidates: list[Candidate], now: float, occupancy: float) -> Ranking: ...
