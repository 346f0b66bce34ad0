"""Encoder replicas: the one with the fewest image tiles waiting is best.

Pending tiles per replica = the larger of what the replica last reported (`pending_tiles` in its
routing stats, refreshed every `request_routing_stats_period_s`, covering every router's traffic)
and the tiles this router sent it that have not completed (exact and immediate for our own traffic).
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel, ConfigDict, Field

from services.policies.scorers.base import Candidate, RoutedRequest


class LeastPendingTilesParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Pending tiles at which the score halves (about one encoder batch).
    half_at: float = Field(default=16.0, gt=0)


class LeastPendingTilesScorer:
    def __init__(self, params: LeastPendingTilesParams):
        self.params = params
        self._inflight: dict[str, dict[str, int]] = defaultdict(dict)  # replica -> request -> tiles

    def pending(self, c: Candidate) -> int:
        return max(int(c.stats.get("pending_tiles", 0)), sum(self._inflight[c.replica_id].values()))

    def score(self, request: RoutedRequest, candidates: list[Candidate]) -> dict[str, float]:
        return {c.replica_id: 1.0 / (1.0 + self.pending(c) / self.params.half_at) for c in candidates}

    def on_routed(self, request: RoutedRequest, replica_id: str) -> None:
        if request.tiles:
            self._inflight[replica_id][request.request_id] = request.tiles

    def on_completed(self, request_id: str, replica_id: str) -> None:
        self._inflight[replica_id].pop(request_id, None)

    def forget_replica(self, replica_id: str) -> None:
        self._inflight.pop(replica_id, None)


PARAMS = LeastPendingTilesParams


def create(params: LeastPendingTilesParams) -> LeastPendingTilesScorer:
    return LeastPendingTilesScorer(params)
