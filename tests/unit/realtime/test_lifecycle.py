"""The realtime session's lifecycle as a state machine: the transitions it allows, `ended` for the
transport, and how a closed session left (moved, taken — taken also by a save that finishes after
the close)."""

from __future__ import annotations

from services.realtime.lifecycle import Lifecycle, Phase


async def test_a_draining_session_moves_and_its_transport_ends():
    life = Lifecycle()
    assert life.serving and life.to(Phase.MIGRATING) and life.serving and not life.ended.done()
    assert not life.to(Phase.MIGRATING)  # once
    assert life.to(Phase.MOVED) and life.ended.done() and not life.serving
    assert life.to(Phase.CLOSED) and life.handed_off == {Phase.MOVED}
    assert not life.to(Phase.OPEN) and life.phase is Phase.CLOSED


async def test_a_session_taken_over_ends_and_keeps_saying_so_once_closed():
    life = Lifecycle()
    assert life.to(Phase.TAKEN) and life.ended.done()
    assert not life.to(Phase.MIGRATING) and not life.to(Phase.MOVED)
    assert life.to(Phase.CLOSED) and life.handed_off == {Phase.TAKEN}


async def test_the_last_save_after_close_may_find_it_taken():
    life = Lifecycle()
    assert life.to(Phase.CLOSED) and not life.ended.done()
    assert life.to(Phase.TAKEN)  # recorded, the phase stays closed
    assert life.phase is Phase.CLOSED and life.handed_off == {Phase.TAKEN} and life.ended.done()
    assert not life.to(Phase.MOVED)
