"""The Serve request router behind every stage deployment that configures `request_router`:
candidates ranked by a weighted pipeline of scorers (services/policies/scorers/), from the profile.

Serve calls `choose_replicas` in the caller's process (the gateway) with the replicas that can take
the request; we return them ranked, one per rank, so Serve tries the best first and falls back when a
replica is full.

A pool of seated sessions (`sessions`: the realtime decode pool) sends each session's calls to its
seat's replica alone (services/router/session_seats.py), whatever the scorers say; a session whose
replica is no longer among Serve's running replicas (drained, killed) is seated on another first.
Without a seat (the store unreachable, or the pool full for a session whose seat lapsed) the scorers
rank the replicas as for any other stage, counted.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omni.v1 import common_pb2
from ray.serve.request_router import LocalityMixin, MultiplexMixin, RequestRouter

from services.common import telemetry
from services.common.redis_config import UNAVAILABLE, async_client
from services.extensions.ray.metrics import metric
from services.policies.scorers import ScorerPipeline
from services.policies.scorers.base import Candidate, RoutedRequest
from services.router.session_seats import OUTCOMES, SessionSeats

log = logging.getLogger("ray.serve")
SEATS_RETRY_S = 5.0  # after the store failed, the scorers route alone this long: no wait per call


def routed_request(pending) -> RoutedRequest:
    """What the scorers need from a pending Serve request (its first argument is a stage proto)."""
    meta = pending.metadata
    tiles = 0
    if pending.args and (items := getattr(pending.args[0], "items", None)) is not None:
        tiles = sum(i.tiles.cols * i.tiles.rows for i in items if i.modality == "image")
    return RoutedRequest(request_id=meta.internal_request_id, session_id=meta.session_id or "", tiles=tiles)


# Not Serve's FIFOMixin: it hands the replica chosen for one request to the oldest one pending, so
# under concurrency a session's seat (or its affinity) would serve another session's call. Serve's
# own matching is by request id: each request goes where its ranking sent it.
class ScoredRequestRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    def initialize_state(
        self,
        scorers: list[dict[str, Any]] | None = None,
        deployment: str = "",
        sessions: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        self.pipeline = ScorerPipeline.from_config(scorers or [{"name": "queue_length"}])
        self._tags = {"deployment": deployment}
        self._decision = metric("omniray_router_decision_seconds")
        self._first_choice = metric("omniray_router_first_choice_total")
        self._ranked_first: dict[str, str] = {}
        self.seats = (
            SessionSeats(async_client(), sessions["pool"], sessions["cap"], sessions["seat_ttl_s"])
            if sessions
            else None
        )
        self._seated = metric("omniray_router_session_seats_total", deployment=deployment,
                              outcome=(*OUTCOMES, "unavailable")) if sessions else None  # fmt: skip
        self._seats_retry_at = 0.0

    async def _seat(self, session: str, running: list[str]) -> str | None:
        """The replica of the session's seat, among `running` (None: route by the scorers)."""
        if time.monotonic() < self._seats_retry_at:
            outcome, replica = "unavailable", None
        else:
            try:
                placement = await self.seats.place(session, running)
                outcome, replica = placement.outcome, placement.replica
            except UNAVAILABLE as e:
                log.warning(
                    "session seats unreachable; routing by the scorers for %.0f s: %s", SEATS_RETRY_S, e
                )
                self._seats_retry_at = time.monotonic() + SEATS_RETRY_S
                outcome, replica = "unavailable", None
        self._seated.inc(tags={**self._tags, "outcome": outcome})
        return replica

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if pending_request is not None:
            # Every ranking covers all replicas (no locality tiers to try first): when none of them
            # takes the request, Serve must back off before asking again, not spin on the event
            # loop that carries every other call's replies.
            pending_request.routing_context.should_backoff = True
        if not candidate_replicas:
            return []
        session = pending_request.metadata.session_id if pending_request is not None else ""
        if self.seats is not None and session:
            # Serve's running replicas, full ones too: a session waits for its own replica
            running = {r.replica_id.unique_id: r for r in candidate_replicas}
            if (seat := await self._seat(session, list(running))) is not None:
                return [[running[seat]]]
        replicas = self.select_available_replicas(candidate_replicas) or list(candidate_replicas)
        by_id = {r.replica_id.unique_id: r for r in replicas}
        candidates = [
            Candidate(rid, self.replica_queue_len_cache.get(r.replica_id), dict(r.routing_stats or {}))
            for rid, r in by_id.items()
        ]
        request = routed_request(pending_request) if pending_request is not None else RoutedRequest("")
        ctx = (
            getattr(pending_request.args[0], "ctx", None)
            if pending_request and pending_request.args
            else None
        )
        with telemetry.stage_span(
            "router", "router.choose_replica", ctx or common_pb2.RequestContext()
        ) as span:
            span.set_attribute("omniray.deployment", self._tags["deployment"])
            span.set_attribute("omniray.candidates", len(candidates))
            start = time.perf_counter()
            ranked = self.pipeline.rank(request, candidates)
            self._decision.observe(time.perf_counter() - start, tags=self._tags)
        if request.request_id:
            if len(self._ranked_first) > 10_000:  # requests cancelled before routing leave entries
                self._ranked_first.clear()
            self._ranked_first[request.request_id] = ranked[0]
        return [[by_id[rid]] for rid in ranked]

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        request = routed_request(pending_request)
        self.pipeline.on_routed(request, replica_id.unique_id)
        if (first := self._ranked_first.pop(request.request_id, None)) is not None:
            outcome = "first" if first == replica_id.unique_id else "fallback"
            self._first_choice.inc(tags={**self._tags, "outcome": outcome})

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self.pipeline.on_completed(internal_request_id, replica_id.unique_id)

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.pipeline.forget_replica(replica_id.unique_id)
