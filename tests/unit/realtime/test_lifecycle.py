"""The realtime session's lifecycle as a state machine: the transitions it allows, `ended` for the
transport, and how a session left (moved, taken) — recorded whenever it happens, also after the
connection closed (a hand-over's or the last save's late finish), as the session's flags were."""

from __future__ import annotations

from services.realtime.lifecycle import Lifecycle, Phase


async def test_a_draining_session_moves_and_its_transport_ends():
    life = Lifecycle()
    assert life.serving and life.to(Phase.MIGRATING) and life.serving and not life.ended.done()
    assert not life.to(Phase.MIGRATING)  # once
    assert life.to(Phase.MOVED) and life.ended.done() and not life.serving
    assert life.to(Phase.CLOSED) and life.handed_off == {Phase.MOVED}
    assert not life.to(Phase.OPEN) and not life.to(Phase.MIGRATING) and life.phase is Phase.CLOSED


async def test_a_session_taken_over_ends_and_stays_taken():
    life = Lifecycle()
    assert life.to(Phase.TAKEN) and life.ended.done() and life.phase is Phase.TAKEN
    assert not life.to(Phase.MIGRATING) and life.phase is Phase.TAKEN
    assert life.to(Phase.CLOSED) and life.handed_off == {Phase.TAKEN}


async def test_how_it_left_is_recorded_after_the_close_too():
    life = Lifecycle()
    assert life.to(Phase.CLOSED) and not life.ended.done()
    assert life.to(Phase.MOVED) and life.to(Phase.TAKEN)  # a late hand-over, then a late save
    assert life.phase is Phase.CLOSED and life.handed_off == {Phase.MOVED, Phase.TAKEN} and life.ended.done()
