"""FCFS: vLLM's own order (arrival), nothing held. The baseline, and what the scheduler falls back to
when no session telemetry is there."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from services.policies.urgency.base import NEVER, Candidate, Classified, UrgencyPolicy


class FcfsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fcfs(UrgencyPolicy):
    name = "fcfs"

    preemptible = frozenset()
    view_free = refill_free = frozenset({"fcfs"})  # views do not matter

    def __init__(self, params: FcfsParams):
        self.params = params

    def classify(self, c: Candidate, now: float, occupancy: float) -> Classified:
        return Classified("fcfs", (c.arrival,), NEVER)


PARAMS = FcfsParams


def create(params: FcfsParams, piece_tokens: int = 0) -> Fcfs:
    return Fcfs(params)  # nothing is paced: the pipeline's granularity does not matter
