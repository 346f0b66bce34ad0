"""FCFS: vLLM's own order (arrival), nothing held. The baseline, and what the scheduler falls back to
when no session telemetry is there."""

from __future__ import annotations

from dataclasses import dataclass

from services.policies.urgency.base import Candidate, Ranking


@dataclass(frozen=True)
class FcfsParams:
    pass


class Fcfs:
    name = "fcfs"

    def __init__(self, params: FcfsParams):
        self.params = params

    def rank(self, candidates: list[Candidate], now: float, occupancy: float) -> Ranking:
        order = sorted(range(len(candidates)), key=lambda i: candidates[i].arrival)
        return Ranking(order, [], ["fcfs"] * len(candidates))


def create(**params) -> Fcfs:
    return Fcfs(FcfsParams(**params))
