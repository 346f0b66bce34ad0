"""What every replica scorer sees and returns. Scorers are pure: no Ray imports, unit-testable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Candidate:
    replica_id: str
    queue_len: int | None  # requests the replica reported in flight (None: unknown yet)
    stats: dict[str, Any] = field(default_factory=dict)  # the replica's record_routing_stats()


@dataclass(frozen=True)
class RoutedRequest:
    request_id: str  # unique per routed call
    session_id: str = ""  # tenant-scoped session key ("" when none)
    tiles: int = 0  # image tiles the call carries (encoder calls)


class Scorer(Protocol):
    def score(self, request: RoutedRequest, candidates: list[Candidate]) -> dict[str, float]:
        """Replica id -> score in [0, 1], higher is better."""

    def on_routed(self, request: RoutedRequest, replica_id: str) -> None: ...

    def on_completed(self, request_id: str, replica_id: str) -> None: ...

    def forget_replica(self, replica_id: str) -> None: ...


class StatelessScorer:
    """Default no-op hooks for scorers that only read the candidates."""

    def on_routed(self, request: RoutedRequest, replica_id: str) -> None:
        pass

    def on_completed(self, request_id: str, replica_id: str) -> None:
        pass

    def forget_replica(self, replica_id: str) -> None:
        pass
