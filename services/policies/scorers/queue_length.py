"""Fewer requests in flight is better (Serve's own signal, as a scorer that pipelines can weigh)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from services.policies.scorers.base import Candidate, RoutedRequest, StatelessScorer


class QueueLengthParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Queue length at which the score halves.
    half_at: float = Field(default=4.0, gt=0)


class QueueLengthScorer(StatelessScorer):
    def __init__(self, params: QueueLengthParams):
        self.params = params

    def score(self, request: RoutedRequest, candidates: list[Candidate]) -> dict[str, float]:
        return {c.replica_id: 1.0 / (1.0 + (c.queue_len or 0) / self.params.half_at) for c in candidates}


PARAMS = QueueLengthParams


def create(params: QueueLengthParams) -> QueueLengthScorer:
    return QueueLengthScorer(params)
