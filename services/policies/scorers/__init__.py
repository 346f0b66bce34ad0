"""Replica scorers: one file per routing signal (typed params, a `create` factory, a test in
tests/unit/router/). A deployment's router runs a weighted pipeline of them, from configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from plugins import Registry
from services.policies.scorers.base import Candidate, RoutedRequest, Scorer

SCORERS: Registry[Scorer] = Registry(
    "scorer",
    {
        "queue_length": "services.policies.scorers.queue_length",
        "least_pending_tiles": "services.policies.scorers.least_pending_tiles",
        "session_affinity": "services.policies.scorers.session_affinity",
    },
)


class ScorerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    weight: float = Field(default=1.0, ge=0)
    params: dict = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self):
        SCORERS.params(self.name, self.params)  # an unknown scorer or a bad parameter fails here
        return self


class ScorerPipeline:
    """Weighted sum of scorer outputs; replicas ranked best first (ties keep candidate order)."""

    def __init__(self, specs: list[ScorerSpec]):
        self.stages: list[tuple[float, Scorer]] = [
            (s.weight, SCORERS.create(s.name, s.params)) for s in specs
        ]

    @classmethod
    def from_config(cls, scorers: list[dict]) -> ScorerPipeline:
        return cls([ScorerSpec.model_validate(s) for s in scorers])

    def rank(self, request: RoutedRequest, candidates: list[Candidate]) -> list[str]:
        total = {c.replica_id: 0.0 for c in candidates}
        for weight, scorer in self.stages:
            for rid, score in scorer.score(request, candidates).items():
                total[rid] += weight * score
        order = {c.replica_id: i for i, c in enumerate(candidates)}
        return sorted(total, key=lambda rid: (-total[rid], order[rid]))

    def on_routed(self, request: RoutedRequest, replica_id: str) -> None:
        for _, scorer in self.stages:
            scorer.on_routed(request, replica_id)

    def on_completed(self, request_id: str, replica_id: str) -> None:
        for _, scorer in self.stages:
            scorer.on_completed(request_id, replica_id)

    def forget_replica(self, replica_id: str) -> None:
        for _, scorer in self.stages:
            scorer.forget_replica(replica_id)
