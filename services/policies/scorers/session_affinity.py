"""Multi-turn: prefer the replica that served the session's previous turn (it holds the session's
KV and caches). Sessions are keyed per tenant by the gateway, so tenants never share an entry."""

from __future__ import annotations

from collections import OrderedDict

from pydantic import BaseModel, ConfigDict, Field

from services.policies.scorers.base import Candidate, RoutedRequest


class SessionAffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_sessions: int = Field(default=100_000, ge=1)


class SessionAffinityScorer:
    def __init__(self, params: SessionAffinityParams):
        self.params = params
        self._owner: OrderedDict[str, str] = OrderedDict()  # session -> replica, least recent first

    def score(self, request: RoutedRequest, candidates: list[Candidate]) -> dict[str, float]:
        owner = self._owner.get(request.session_id) if request.session_id else None
        return {c.replica_id: 1.0 if c.replica_id == owner else 0.0 for c in candidates}

    def on_routed(self, request: RoutedRequest, replica_id: str) -> None:
        if request.session_id:
            self._owner[request.session_id] = replica_id
            self._owner.move_to_end(request.session_id)
            while len(self._owner) > self.params.max_sessions:
                self._owner.popitem(last=False)

    def on_completed(self, request_id: str, replica_id: str) -> None:
        pass

    def forget_replica(self, replica_id: str) -> None:
        for session in [s for s, r in self._owner.items() if r == replica_id]:
            del self._owner[session]


PARAMS = SessionAffinityParams


def create(params: SessionAffinityParams) -> SessionAffinityScorer:
    return SessionAffinityScorer(params)
