"""Where a realtime session is in its life, as one state machine (services/realtime/session.py).

    OPEN ──drain──▶ MIGRATING ──turn boundary──▶ MOVED
      │                 │                          │
      └──── resumed by another connection ──▶ TAKEN ◀┘
    (any) ──connection closes──▶ CLOSED

MOVED: its client was told to reconnect elsewhere, and its tenant slot is kept for that reconnect.
TAKEN: another connection resumed it; the slot and the playback monitor's entry are the new one's.
Either ends the transport's loop (`ended`). CLOSED: nothing more is saved or sent. How it left is
kept in `handed_off` whenever it happens — a hand-over or the last save may finish after the
connection closed (or after a take-over): the tenant's slot is then kept for the reconnect."""

from __future__ import annotations

import asyncio
import enum


class Phase(enum.Enum):
    OPEN = "open"
    MIGRATING = "migrating"
    MOVED = "moved"
    TAKEN = "taken"
    CLOSED = "closed"


_NEXT = {
    Phase.OPEN: {Phase.MIGRATING, Phase.MOVED, Phase.TAKEN, Phase.CLOSED},
    Phase.MIGRATING: {Phase.MOVED, Phase.TAKEN, Phase.CLOSED},
    Phase.MOVED: {Phase.TAKEN, Phase.CLOSED},  # a save after the move may find it resumed
    Phase.TAKEN: {Phase.CLOSED},
    Phase.CLOSED: set(),
}


class Lifecycle:
    def __init__(self):
        self.phase = Phase.OPEN
        self.handed_off: set[Phase] = set()  # MOVED, TAKEN: what it was
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()  # the transport stops

    def to(self, phase: Phase) -> bool:
        """Move to `phase` if the machine allows it from here; whether it did."""
        allowed = phase in _NEXT[self.phase]
        if allowed:
            self.phase = phase
        if phase in (Phase.MOVED, Phase.TAKEN):  # how it left, whenever it did (see the module doc)
            self.handed_off.add(phase)
            if not self.ended.done():
                self.ended.set_result(None)
            return True
        return allowed

    @property
    def serving(self) -> bool:
        """Open (or draining, not yet moved): its events are handled, its turns saved."""
        return self.phase in (Phase.OPEN, Phase.MIGRATING)
