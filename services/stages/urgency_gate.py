"""Urgency-ordered steps in the speech stages (talker, vocoder).

A talker or vocoder replica runs at most `slots` model steps at once (more only fight over the same
cores); when a step ends, the waiting step whose session is most urgent goes next, ranked by the
same urgency policy and session board as the decode engine's scheduler (services/policies/urgency/):
a session whose client is about to run dry (U0) before a first reply (U1) before a well-buffered one
(U2). Steps of requests without a realtime session rank by arrival, as U1. Nothing is held back
here: generation far ahead of playback is held at decode, before it reaches these stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from services.playback.board import BoardView
from services.policies.urgency.base import Candidate, UrgencyPolicy


class UrgencyGate:
    def __init__(self, policy: UrgencyPolicy, views: Callable[[], dict[str, BoardView]], slots: int):
        if slots < 1:
            raise ValueError("an urgency gate needs at least one slot")
        self.policy, self.views, self.slots = policy, views, slots
        self.busy = 0
        self.waiting: list[tuple[float, str, asyncio.Future]] = []  # (arrival, session, granted)

    @contextlib.asynccontextmanager
    async def step(self, session: str) -> AsyncIterator[float]:
        """Hold a slot for one model step; yields the seconds waited for it."""
        arrived = time.time()
        if self.busy < self.slots and not self.waiting:
            self.busy += 1
        else:
            granted = asyncio.get_running_loop().create_future()
            entry = (arrived, session, granted)
            self.waiting.append(entry)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release()  # the slot was handed over as the caller went away
                elif entry in self.waiting:
                    self.waiting.remove(entry)
                raise
        try:
            yield time.time() - arrived
        finally:
            self._release()

    def _release(self) -> None:
        """Hand the slot to the most urgent waiting step, or free it."""
        # A waiter cancelled a moment ago may still be listed (its future is cancelled): skip it.
        self.waiting = [w for w in self.waiting if not w[2].done()]
        if not self.waiting:
            self.busy -= 1
            return
        first = most_urgent_first(self.policy, self.views(), [(a, s) for a, s, _ in self.waiting])[0]
        _, _, granted = self.waiting.pop(first)
        granted.set_result(None)


def most_urgent_first(
    policy: UrgencyPolicy,
    views: dict[str, BoardView],
    waiting: list[tuple[float, str]],
    now: float | None = None,
) -> list[int]:
    """Indices of `waiting` (arrival, session) in the order the policy serves them at `now` (wall
    time unless given): its order, then what it would hold back, by arrival (nothing is held here)."""
    candidates = [Candidate(arrival, 0, 0, views.get(session)) for arrival, session in waiting]
    ranking = policy.rank(candidates, time.time() if now is None else now, 0.0)
    return list(ranking.order) + sorted(ranking.held, key=lambda i: candidates[i].arrival)
