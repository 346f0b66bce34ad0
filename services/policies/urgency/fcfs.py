"""FCFS: vLLM's own order (arrival), nothing held. The baseline, and what the scheduler falls back to
when no session telemetry is there."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from services.policies.urgency.base import Candidate, Ranking


class FcfsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fcfs:
    name = "fcfs"

    def __init__(self, params: FcfsParams):
        self.params = params

    def rank(self, candidates: list[Candidate], now: float, occupancy: float) -> Ranking:
        order = sorted(range(len(candidates)), key=lambda i: candidates[i].arrival)
        return Ranking(order, [], ["fcfs"] * len(candidates))


PARAMS = FcfsParams


def create(params: FcfsParams) -> Fcfs:
    return Fcfs(params)
