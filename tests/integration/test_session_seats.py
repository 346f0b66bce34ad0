"""The realtime decode pool's seats (services/router/session_seats.py) on a real Redis: sessions spread
over the live replicas up to the cap and then are refused; a session keeps its replica while it is
live and moves (to a replica with room) once it is not; an accepted session is never left without a
replica while one is live; seats and registrations lapse; and, for any sequence of opens, turns,
drains, kills and closes, no replica holds more than the cap unless an accepted session overflowed."""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.redis_config import async_client
from services.router.session_seats import SessionSeats


def _seats(redis_url: str, cap: int = 2, ttl_s: float = 60.0) -> SessionSeats:
    return SessionSeats(async_client(redis_url), f"test-{uuid.uuid4().hex[:8]}", cap, ttl_s)


async def test_sessions_spread_over_the_replicas_up_to_the_cap(redis_url):
    seats = _seats(redis_url, cap=2)
    for r in ("a", "b"):
        await seats.register(r, 30)
    placed = [await seats.place(f"s{i}") for i in range(4)]
    assert [p.outcome for p in placed] == ["placed"] * 4
    assert sorted(p.replica for p in placed) == ["a", "a", "b", "b"]
    assert placed[0].replica != placed[1].replica  # the least held first
    full = await seats.place("s4")
    assert (full.replica, full.outcome) == (None, "full")
    assert await seats.occupancy() == {"a": 2, "b": 2}
    # a session that ends gives its seat to the next
    assert await seats.release("s0") == placed[0].replica
    assert (await seats.place("s4")).replica == placed[0].replica


async def test_a_session_keeps_its_replica_and_moves_when_it_goes(redis_url):
    seats = _seats(redis_url, cap=2)
    for r in ("a", "b", "c"):
        await seats.register(r, 30)
    first = await seats.place("s")
    for _ in range(3):  # every turn on the same replica, whatever the others hold
        again = await seats.place("s", ["a", "b", "c"])
        assert (again.replica, again.outcome) == (first.replica, "kept")
    rest = [r for r in ("a", "b", "c") if r != first.replica]
    moved = await seats.place("s", rest)  # its replica no longer among Serve's running ones
    assert moved.outcome == "migrated" and moved.replica in rest
    assert (await seats.occupancy())[first.replica] == 0  # the old seat is given back
    await seats.withdraw(moved.replica)  # drained: a new session is not seated there
    assert moved.replica not in await seats.occupancy()
    assert (await seats.place("t")).replica not in (moved.replica, None)


async def test_an_accepted_session_overflows_rather_than_being_lost(redis_url):
    seats = _seats(redis_url, cap=1)
    await seats.register("a", 30)
    await seats.register("b", 30)
    s, t = await seats.place("s"), await seats.place("t")
    assert {s.replica, t.replica} == {"a", "b"}
    # s's replica goes while the other is full: s takes it over the cap, a new session is refused
    over = await seats.place("s", [t.replica])
    assert (over.replica, over.outcome) == (t.replica, "overflow")
    assert (await seats.place("u", [t.replica])).outcome == "full"
    assert (await seats.place("s", [])).outcome == "full"  # no replica live at all


async def test_seats_and_registrations_lapse_unless_renewed(redis_url):
    seats = _seats(redis_url, cap=1, ttl_s=0.3)
    await seats.register("a", 0.3)
    assert (await seats.place("s")).replica == "a"
    assert (await seats.place("t")).outcome == "full"
    await asyncio.sleep(0.2)
    assert await seats.renew(["s", "gone"]) == 1
    await seats.register("a", 0.3)
    await asyncio.sleep(0.2)
    assert (await seats.place("t")).outcome == "full"  # s's seat was renewed
    await asyncio.sleep(0.35)
    assert await seats.occupancy() == {}  # a registered no more: lapsed
    await seats.register("a", 30)
    assert (await seats.place("t")).replica == "a"  # s's seat lapsed with it


OPS = st.lists(
    st.tuples(st.sampled_from(["open", "turn", "close", "drain", "kill", "start"]), st.integers(0, 7)),
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_no_replica_holds_more_than_the_cap_but_for_overflows(redis_url, ops):
    async def run() -> None:
        seats = _seats(redis_url, cap=2)
        running = ["r0", "r1", "r2"]
        for r in running:
            await seats.register(r, 60)
        accepted: set[str] = set()
        overflowed = 0
        for op, i in ops:
            session, replica = f"s{i}", f"r{i % 5}"
            if op == "open" and session not in accepted:
                if (await seats.place(session)).replica is not None:
                    accepted.add(session)
            elif op == "turn" and session in accepted:
                placed = await seats.place(session, running)
                assert placed.replica is not None or not running  # accepted: never left seatless
                overflowed += placed.outcome == "overflow"
            elif op == "close" and session in accepted:
                await seats.release(session)
                accepted.discard(session)
            elif op in ("drain", "kill") and replica in running:
                running.remove(replica)
                if op == "drain":
                    await seats.withdraw(replica)
            elif op == "start" and replica not in running:
                running.append(replica)
                await seats.register(replica, 60)
            held = await seats.occupancy()
            assert sum(max(0, n - seats.cap) for r, n in held.items() if r in running) <= overflowed
            assert sum(held.values()) <= len(accepted)

    asyncio.run(run())
