"""The incremental urgency plan agrees with a full ranking at every round, over random runs of
arrivals, departures, generated tokens, playback and board views (through the board decoder, so
kept view objects and the change log are exercised), while classifying far fewer requests."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.playback.board import BoardView, decode
from services.policies import urgency
from services.policies.urgency.plan import UrgencyPlan

STEP_S = 0.025
KV = 1000  # constant: a U2 key's score then does not drift, so the orders must match exactly


class Req:
    def __init__(self, session: str | None, arrival: float):
        self.session, self.arrival, self.generated = session, arrival, 0


def _view(sid, played, buffered, first_audio, barge_ins, at) -> BoardView:
    return BoardView(session_id=sid, played_ms=played, age_s=0.0, ms_per_token=100.0, buffered_ms=buffered,
                     playing=buffered > 0, speaking=False, responding=True, first_audio=first_audio,
                     barge_ins=barge_ins, responses=1, reply_gap_ms=None, at=at)  # fmt: skip


class _World:
    def __init__(self, rng: random.Random):
        self.rng, self.now = rng, 1000.0
        self.sessions = {
            f"s{i}": [0.0, rng.uniform(0, 6000), rng.random() < 0.8, 0, self.now] for i in range(12)
        }
        self.requests = [
            Req(rng.choice([*self.sessions, None]), self.now - rng.uniform(0, 5)) for _ in range(10)
        ]
        self.views = decode({}, None, self.now)
        self.left: list[Req] = []  # requests that left the queue (some come back)

    def step(self, held: list) -> None:
        rng, self.now = self.rng, self.now + STEP_S
        for r in self.requests:
            if r not in held:
                r.generated += 1
        if rng.random() < 0.2 and self.requests:
            gone = rng.choice(self.requests)
            self.requests.remove(gone)
            self.left.append(gone)
        if rng.random() < 0.1 and self.left:  # back in the queue (a preempted request resumed)
            self.requests.append(self.left.pop(rng.randrange(len(self.left))))
        if rng.random() < 0.2:
            self.requests.append(Req(rng.choice([*self.sessions, None]), self.now))
        for s in self.sessions.values():  # playback in real time; now and then a chunk or a barge-in
            drained = min(s[1], (self.now - s[4]) * 1000)
            s[0], s[1], s[4] = s[0] + drained, s[1] - drained, self.now
            if rng.random() < 0.05:
                s[1] += rng.uniform(0, 3000)
                s[2] = True
            if rng.random() < 0.01:
                s[1], s[2], s[3] = 0.0, False, s[3] + 1
        if rng.random() < 0.5:  # a board poll
            raw = {
                sid: json.dumps(asdict(_view(sid, *s)))
                for sid, s in self.sessions.items()
                if rng.random() < 0.95
            }
            self.views = decode(raw, self.views, self.now)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(["fcfs", "liveserve"]),
    st.floats(0, 1),
    st.sampled_from([0, 10]),
    st.booleans(),
)
def test_the_plan_orders_as_a_full_ranking_would(seed, name, occupancy, piece_tokens, yield_to_turns):
    params = {"safe_ms": 1000, "hold_ms": 3000, "resume_ms": 1000, "yield_to_turns": yield_to_turns}
    params = params if name == "liveserve" else {}
    policy = urgency.create(name, params, piece_tokens=piece_tokens)
    plan = UrgencyPlan(policy, lambda r: (r.session, r.arrival), lambda r: (KV, r.generated), refresh_s=3600)
    world = _World(random.Random(seed))
    classified = 0
    for _ in range(150):
        order, held = plan.arrange(list(world.requests), world.views, world.now, occupancy)
        classified += plan.classified
        assert sorted(map(id, order + held)) == sorted(map(id, world.requests))  # none lost, none twice
        candidates = [
            urgency.Candidate(r.arrival, KV, r.generated, world.views.get(r.session) if r.session else None)
            for r in world.requests
        ]
        full = policy.rank(candidates, world.now, occupancy)
        ahead = set()  # run by the plan within a piece past where a full ranking holds them
        for i, r in enumerate(world.requests):
            mine, theirs = plan.class_of(r), full.classes[i]
            # a held request stays held until playback is resume_ms below hold_ms, or its buffer
            # nears safe_ms (hysteresis); a U2 request found due for its refill stays due through
            # refills (U2 is refill_free) until classified again, so it may run a piece past its hold
            if mine == "U2" and theirs == "held" and _within_a_piece(policy, candidates[i], world.now):
                ahead.add(id(r))
                continue
            assert mine == theirs or (mine == "held" and theirs == "U2"), (mine, theirs)
        held_ids = set(map(id, held))
        expected = [world.requests[i] for i in full.order if id(world.requests[i]) not in held_ids]
        assert set(map(id, order)) == set(map(id, expected)) | ahead
        keys = [plan.key_of(r) for r in order]
        assert keys == sorted(keys)
        for r in order:
            i = world.requests.index(r)
            mine, theirs = plan.key_of(r), policy.classify(candidates[i], world.now, occupancy).key
            # due through refills until classified again: it yields less, never more
            assert mine == theirs or (mine[:2], theirs[:2], mine[2:]) == ((2, 0), (2, 1), theirs[2:])
        if policy.yields_from is not None:  # what yields to a turn: U2 whose refill is not yet due
            ran = order[:]
            assert plan.yielding(ran, held) == len(held) - len(held_ids)
            yielded = held[len(held_ids) :]
            assert ran + yielded[::-1] == order  # the end of the order, least urgent first
            for r in yielded:
                i = world.requests.index(r)
                c = policy.classify(candidates[i], world.now, occupancy)
                assert c.cls == "U2" and c.key >= policy.yields_from
        world.step(held)
    assert classified < 150 * 10  # not everything every round


def _within_a_piece(policy, candidate: urgency.Candidate, now: float) -> bool:
    """Whether a request a full ranking holds is within the piece a due refill's hold counts."""
    pace = policy.classify(candidate, now, 0.5).pace
    return now < pace.release_by and pace.ahead(candidate.generated, now) <= pace.hold_at(pace.release_by)


def test_a_round_without_changes_classifies_nothing():
    policy = urgency.create("liveserve", {})
    plan = UrgencyPlan(policy, lambda r: (r.session, r.arrival), lambda r: (KV, r.generated))
    requests = [Req(None, float(i)) for i in range(5)]
    views = decode({}, None, 1000.0)
    first, _ = plan.arrange(requests, views, 1000.0, 0.5)
    assert plan.classified == 5 and first == requests
    again, _ = plan.arrange(first, views, 1000.1, 0.5)
    assert plan.classified == 0 and again == requests
    gone = again[1:] + [Req(None, 9.0)]  # one left, one arrived
    third, _ = plan.arrange(gone, views, 1000.2, 0.5)
    assert plan.classified == 1 and third == gone


def test_only_classes_whose_keys_read_kv_or_occupancy_are_refreshed():
    policy = urgency.create("liveserve", {})
    buffered = decode({"s": json.dumps(asdict(_view("s", 0.0, 60_000.0, True, 0, 1000.0)))}, None, 1000.0)
    requests = [Req(None, 1.0), Req("s", 2.0)]  # U1 (no view), U2 (a minute of audio buffered)
    plan = UrgencyPlan(policy, lambda r: (r.session, r.arrival), lambda r: (KV, r.generated), refresh_s=1.0)
    order, _ = plan.arrange(requests, buffered, 1000.0, 0.5)
    assert [plan.class_of(r) for r in requests] == ["U1", "U2"]
    again, _ = plan.arrange(order, buffered, 1001.5, 0.5)  # past refresh_s, the U2 buffer far from safe_ms
    assert plan.classified == 1  # the U2 score (KV, occupancy) again; U1's key reads neither
    full = UrgencyPlan(policy, lambda r: (r.session, r.arrival), lambda r: (KV, r.generated), refresh_s=0)
    order, _ = full.arrange(requests, buffered, 1000.0, 0.5)
    full.arrange(order, buffered, 1000.1, 0.5)
    assert full.classified == 2  # refresh_s 0: every request every round (the benchmarks' baseline)


def test_a_held_request_runs_again_as_u2_before_its_buffer_runs_low():
    params = {"safe_ms": 1000, "hold_ms": 5000, "resume_ms": 2000, "lead_ms": 250}
    plan = UrgencyPlan(urgency.create("liveserve", params), lambda r: (r.session, r.arrival),
                       lambda r: (KV, r.generated))  # fmt: skip
    # 6 s generated (100 ms a token), 3 s of it at the client: the buffer reaches safe_ms at 1002.0
    views = decode({"s": json.dumps(asdict(_view("s", 0.0, 3000.0, True, 0, 1000.0)))}, None, 1000.0)
    request = Req("s", 1.0)
    request.generated = 60
    _, held = plan.arrange([request], views, 1000.0, 0.5)
    assert held == [request]
    _, held = plan.arrange([request], views, 1001.7, 0.5)
    assert held == [request]
    # lead_ms before: released, not classified again; its refill is due: it no longer yields
    order, held = plan.arrange([request], views, 1001.76, 0.5)
    assert order == [request] and not held and plan.class_of(request) == "U2" and plan.classified == 0
    assert plan.yielding(order, held) == 0 and order == [request]


def _piece_plan(yield_to_turns: bool) -> tuple[UrgencyPlan, urgency.UrgencyPolicy]:
    # hold 3250 ms (lead 250), a piece of 10 tokens (1000 ms) on it once the refill is due
    params = {"safe_ms": 1000, "hold_ms": 3000, "resume_ms": 1000, "yield_to_turns": yield_to_turns}
    policy = urgency.create("liveserve", params, piece_tokens=10)
    return UrgencyPlan(policy, lambda r: (r.session, r.arrival), lambda r: (KV, r.generated)), policy


def _held_by_a_full_ranking(policy, request: Req, views, now: float) -> bool:
    candidate = urgency.Candidate(request.arrival, KV, request.generated, views.get("s"))
    return policy.rank([candidate], now, 0.5).held == [0]


def test_a_due_refill_keeps_its_piece_through_a_refill_until_classified_again():
    """Its refill due (the buffer near safe_ms + lead), a request may run a piece past its hold.
    Audio that reaches its client then puts the refill off, which a full ranking sees at once; the
    plan lets the refill pass (U2 is refill_free) and sees it when the classification runs out: at
    most lead_ms later, when the buffer would have been at safe_ms."""
    plan, policy = _piece_plan(yield_to_turns=True)
    # 3 s at the client at 1000.0: safe_ms at 1002.0, the refill due from 1001.75
    views = decode({"s": json.dumps(asdict(_view("s", 0.0, 3000.0, True, 0, 1000.0)))}, None, 1000.0)
    request = Req("s", 1.0)
    request.generated = 55  # 3700 ms ahead of playback at 1001.8: over the hold, not the piece
    order, held = plan.arrange([request], views, 1001.8, 0.5)
    assert order == [request] and not _held_by_a_full_ranking(policy, request, views, 1001.8)
    # 2 s more audio reached the client: safe_ms at 1004.0, the refill no longer due
    views = decode({"s": json.dumps(asdict(_view("s", 1850.0, 3150.0, True, 0, 1001.85)))}, views, 1001.85)
    order, held = plan.arrange(order + held, views, 1001.9, 0.5)
    assert order == [request] and plan.classified == 0
    assert _held_by_a_full_ranking(policy, request, views, 1001.9)
    order, held = plan.arrange(order + held, views, 1002.0, 0.5)
    assert held == [request] and plan.classified == 1


def _paced_run(period_s: Callable[[int], float], rounds: int):
    """One well-buffered request run round by round (a token a round unless held; round i lasts
    `period_s(i)`), against a full ranking: yields (round, held by the plan, held by a full
    ranking, requests read so far)."""
    params = {"safe_ms": 1000, "hold_ms": 3000, "resume_ms": 1000, "lead_ms": 250}
    policy = urgency.create("liveserve", params)
    reads: list[Req] = []
    plan = UrgencyPlan(
        policy, lambda r: (r.session, r.arrival), lambda r: (reads.append(r), (KV, r.generated))[1]
    )
    # a minute buffered at the client (its refill far from due); 1 s generated ahead of playback
    views = decode({"s": json.dumps(asdict(_view("s", 0.0, 60_000.0, True, 0, 1000.0)))}, None, 1000.0)
    request, now = Req("s", 1.0), 1000.0
    request.generated = 10
    for i in range(rounds):
        _, held = plan.arrange([request], views, now, 0.5)
        yield i, request in held, _held_by_a_full_ranking(policy, request, views, now), len(reads)
        request.generated += request not in held
        now += period_s(i)


def test_a_running_request_is_checked_once_on_its_way_to_its_hold():
    """Playback moves on while a request runs: its next check counts on the rounds' shortest
    period of late, so a request released with resume_ms to its hold is read twice after its
    release (at one check, and as it is held), and held in the round a full ranking holds it."""
    cycles, released_at = [], None
    for i, mine, full, reads in _paced_run(lambda i: 0.025, 400):
        assert mine == full or (mine and not full), i  # never late (released with hysteresis)
        if not mine and released_at is None:
            released_at = reads
        elif mine and released_at is not None:
            cycles.append(reads - released_at)
            released_at = None
    # the first cycle counts on no period yet
    assert len(cycles) >= 3 and set(cycles[1:]) == {2}, cycles


def test_rounds_that_get_shorter_hold_a_request_a_few_rounds_late_once():
    """A check counts on rounds at least as long as the shortest of late: when they get 2.5 times
    shorter just after a release (round 71), the hold comes two rounds (tokens) late; the next
    cycles count on the new period."""
    rounds = _paced_run(lambda i: 0.025 if i < 73 else 0.01, 400)
    assert [i for i, mine, full, _ in rounds if full and not mine] == [83, 84]


def test_an_engine_idle_between_two_rounds_does_not_make_holds_late():
    """Half a second between two rounds while the request is held (rounds 110–111): the next
    rounds are as short as before, and its checks count on them."""
    rounds = _paced_run(lambda i: 0.5 if i == 110 else 0.025, 400)
    assert all(mine or not full for _, mine, full, _ in rounds)


def test_rounds_that_get_shorter_after_long_ones_hold_a_request_late_by_a_bounded_share():
    """Playback counts for at most a quarter of what the tokens gain: after 150 rounds of 90 ms
    (playback takes 90 of a token's 100 ms), rounds of 25 ms do not find checks set far ahead."""
    rounds = _paced_run(lambda i: 0.09 if i < 150 else 0.025, 500)
    assert all(mine or not full for _, mine, full, _ in rounds)


@pytest.mark.timeout(10)
def test_a_release_over_its_hold_by_less_than_the_clock_resolution_waits_for_the_next_round():
    """Wall-clock time (~1.7e9 s) cannot tell `now` from now + 1e-8 s: a release that finds its
    request over its hold by 1e-5 ms (a token that landed late) is timed again at `now`, and must
    not be popped again in the same round."""
    t0 = 1_764_000_000.0
    # a 300 ms reply gap (hold 3299.99999 ms), the refill due from t0 + 0.1, U0 from t0 + 0.4
    view = BoardView(**{**_view("s", 0.0, 1900.0, True, 0, t0).__dict__, "reply_gap_ms": 299.99999})
    views = decode({"s": json.dumps(asdict(view))}, None, t0)
    plan = UrgencyPlan(
        urgency.create("liveserve", {}), lambda r: (r.session, r.arrival), lambda r: (KV, r.generated)
    )
    request = Req("s", 1.0)
    request.generated = 35  # 3300 ms ahead at t0 + 0.2
    order, held = plan.arrange([request], views, t0 + 0.2, 0.5)
    assert held == [request]
    request.generated += 1  # its last token lands late: over its hold again at the release
    order, held = plan.arrange(order + held, views, t0 + 0.3, 0.5)
    assert held == [request]


def test_the_plan_counts_turns_and_yields_the_well_buffered_until_their_refill_is_due():
    plan = UrgencyPlan(urgency.create("liveserve", {}), lambda r: (r.session, r.arrival),
                       lambda r: (KV, r.generated))  # fmt: skip
    raw = {  # t: a new turn (no audio yet); b: a minute buffered; c: 3 s buffered; d: U0
        "t": _view("t", 0.0, 0.0, False, 0, 1000.0),
        "b": _view("b", 0.0, 60_000.0, True, 0, 1000.0),
        "c": _view("c", 0.0, 3_000.0, True, 0, 1000.0),
        "d": _view("d", 0.0, 500.0, True, 0, 1000.0),
    }
    views = decode({k: json.dumps(asdict(v)) for k, v in raw.items()}, None, 1000.0)
    turn, calm, soon, low, text = Req("t", 1.0), Req("b", 2.0), Req("c", 2.5), Req("d", 3.0), Req(None, 4.0)
    order, _ = plan.arrange([turn, calm, soon, low, text], views, 1000.0, 0.5)
    assert order == [low, turn, text, calm, soon] and plan.turns == 1  # a text request is no turn
    held: list = []
    assert plan.yielding(order, held) == 2 and order == [low, turn, text] and held == [soon, calm]
    # c's buffer reaches safe_ms (1.5 s) at 1001.5: its refill is due lead_ms (0.25 s) before, and
    # it goes first among U2 then, without a classification
    order, held = plan.arrange(order + held, views, 1001.3, 0.5)
    assert plan.classified == 0 and order == [low, turn, text, soon, calm]
    assert plan.yielding(order, held) == 1 and order == [low, turn, text, soon] and held == [calm]
    raw["t"] = _view("t", 0.0, 2000.0, True, 0, 1001.4)  # its first audio: no longer a turn
    views = decode({k: json.dumps(asdict(v)) for k, v in raw.items()}, views, 1001.4)
    plan.arrange(order, views, 1001.4, 0.5)
    assert plan.turns == 0
    plan.arrange([], views, 1001.5, 0.5)
    assert plan.turns == 0 and not plan.yielding([], [])


def test_a_yielding_request_is_checked_by_the_rounds_it_ran_and_by_every_round_once_due():
    """While a turn is in the queues a well-buffered request sits rounds out and generates nothing:
    its hold is not checked in those rounds. Once its refill is due it runs every round and is held
    in the first round it is over its hold, as a full ranking would hold it."""
    policy = urgency.create(
        "liveserve", {"safe_ms": 1000, "hold_ms": 3000, "resume_ms": 1000, "lead_ms": 250}
    )
    reads: list[Req] = []
    plan = UrgencyPlan(
        policy, lambda r: (r.session, r.arrival), lambda r: (reads.append(r), (KV, r.generated))[1]
    )
    raw = {  # t: a new turn; b: a minute buffered (yields throughout); c: 2 s buffered, due at 1000.75
        "t": _view("t", 0.0, 0.0, False, 0, 1000.0),
        "b": _view("b", 0.0, 60_000.0, True, 0, 1000.0),
        "c": _view("c", 0.0, 2_000.0, True, 0, 1000.0),
    }
    views = decode({k: json.dumps(asdict(v)) for k, v in raw.items()}, None, 1000.0)
    turn, calm, soon = Req("t", 1.0), Req("b", 2.0), Req("c", 3.0)
    soon.generated = 20  # 2 s of audio (100 ms a token), 13 tokens below its hold (3.25 s with the lead)
    requests, rounds, yielded_rounds = [turn, calm, soon], 0, 0
    while True:
        now = 1000.0 + rounds / 100
        order, held = plan.arrange(requests, views, now, 0.5)
        candidates = [urgency.Candidate(r.arrival, KV, r.generated, views.get(r.session)) for r in requests]
        full = policy.rank(candidates, now, 0.5)
        assert (plan.class_of(soon) == "held") == (full.classes[requests.index(soon)] == "held")
        if soon in held:
            break
        yielded = plan.yielding(order, held)
        if soon in held:  # not yet due: it sits the round out
            yielded_rounds += 1
        else:
            assert now >= 1000.75 and yielded == 1  # due: it runs; the minute-buffered one still yields
            soon.generated += 1
        requests, rounds = order + held, rounds + 1
    assert yielded_rounds == 75 and now < 1001.0
    # read at its classifications (the first, and again as it is held) and at its checks: none
    # while it yielded, a few once it ran
    assert reads.count(soon) <= 5


def _async_round(
    plan, policy, requests: list, views, now: float, watched: Req, in_flight: list
) -> list | None:
    """One round of an engine under vLLM's async scheduling: the plan arranges `requests` and holds
    `watched` exactly when a full ranking does; the turns' yield as the engine's scheduler does it
    (only while a turn is there); whether `watched` runs goes into `in_flight` (its tokens land two
    rounds later). The requests handed back, or None once `watched` is held."""
    order, held = plan.arrange(requests, views, now, 0.5)
    candidate = urgency.Candidate(watched.arrival, KV, watched.generated, views.get(watched.session))
    over = policy.rank([candidate], now, 0.5).classes == ["held"]
    assert (watched in held) == over, now
    if over:
        return None
    if plan.turns:
        plan.yielding(order, held)
    in_flight.insert(0, int(watched not in held))
    return order + held


@given(st.integers(1, 20))
@settings(max_examples=20, deadline=None)
def test_a_token_that_lands_in_a_round_sat_out_counts_toward_the_hold(turn_round):
    """vLLM's async scheduling: a round's token lands while the next round runs, and is seen the
    round after. A well-buffered request that ran a round and then sat one out for a turn is checked
    as if it had run in both, and held in the round a full ranking holds it."""
    policy = urgency.create(
        "liveserve", {"safe_ms": 1000, "hold_ms": 3000, "resume_ms": 1000, "lead_ms": 250}
    )
    plan = UrgencyPlan(policy, lambda r: (r.session, r.arrival), lambda r: (KV, r.generated))
    raw = {"t": _view("t", 0.0, 0.0, False, 0, 1000.0), "b": _view("b", 0.0, 60_000.0, True, 0, 1000.0)}
    views = decode({k: json.dumps(asdict(v)) for k, v in raw.items()}, None, 1000.0)
    turn, calm = Req("t", 1.0), Req("b", 2.0)
    calm.generated = 20  # 13 tokens below its hold, its refill far from due: it yields to turns
    requests, in_flight = [calm], [0, 0]  # tokens scheduled one and two rounds ago
    for rounds in range(40):
        now = 1000.0 + rounds / 100
        calm.generated += in_flight.pop()  # the token of two rounds ago is seen
        if rounds == turn_round:
            requests = [*requests, turn]
        elif turn in requests:
            requests = [r for r in requests if r is not turn]
        requests = _async_round(plan, policy, requests, views, now, calm, in_flight)
        if requests is None:
            return
    raise AssertionError("never held")


@given(st.integers(2, 12), st.integers(0, 12), st.floats(2400, 3240))
@settings(max_examples=40, deadline=None)
def test_a_token_in_flight_as_a_request_falls_to_the_yielding_end_counts_toward_its_hold(
    switch, stay, buffered
):
    """vLLM's async scheduling, as above: a request that ran as U0 is classified into the yielding
    end (a refill left it well buffered) while that end sits rounds out for a turn. Its last U0
    token is still in flight, and may take it over its hold (a buffer above 3.16 s here): it is
    held in the round a full ranking holds it, not let run a token more when the turn leaves."""
    policy = urgency.create(
        "liveserve", {"safe_ms": 1000, "hold_ms": 3000, "resume_ms": 1000, "lead_ms": 250}
    )
    plan = UrgencyPlan(policy, lambda r: (r.session, r.arrival), lambda r: (KV, r.generated))
    raw = {
        "t": _view("t", 0.0, 0.0, False, 0, 1000.0),
        "b": _view("b", 0.0, 60_000.0, True, 0, 1000.0),  # yields to the turn throughout
        "x": _view("x", 0.0, 500.0, True, 0, 1000.0),  # U0: runs every round
    }
    views = decode({k: json.dumps(asdict(v)) for k, v in raw.items()}, None, 1000.0)
    turn, calm, low = Req("t", 1.0), Req("b", 2.0), Req("x", 3.0)
    calm.generated = 20
    requests, in_flight = [turn, calm, low], [0, 0]  # low's tokens scheduled one and two rounds ago
    for rounds in range(200):
        now = 1000.0 + rounds / 100
        low.generated += in_flight.pop()
        if rounds == switch:  # a refill: its refill is due again well after the turn leaves
            raw["x"] = _view("x", low.generated * 100.0 - buffered, buffered, True, 0, now)
            views = decode({k: json.dumps(asdict(v)) for k, v in raw.items()}, views, now)
        if rounds == switch + stay:  # the turn has its first audio: the yielding end runs again
            requests = [r for r in requests if r is not turn]
        requests = _async_round(plan, policy, requests, views, now, low, in_flight)
        if requests is None:
            return
    raise AssertionError("never held")


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_the_plans_pending_timers_and_checks_stay_bounded_by_its_requests(seed):
    """Timers and checks of requests gone or classified again since are dropped, so what a plan
    keeps pending grows with the requests in it, not with the rounds it has run."""
    policy = urgency.create(
        "liveserve", {"safe_ms": 1000, "hold_ms": 3000, "resume_ms": 1000}, piece_tokens=10
    )
    plan = UrgencyPlan(policy, lambda r: (r.session, r.arrival), lambda r: (KV, r.generated), refresh_s=0.5)
    world = _World(random.Random(seed))
    for _ in range(1500):
        _, held = plan.arrange(list(world.requests), world.views, world.now, 0.5)
        pending = sum(map(len, (plan._timers, plan._releases, plan._checks, plan._tail_checks, plan._rekeys)))
        # the plan compacts past 4 × its requests + 64; a round's pushes may wait for the next one
        assert pending <= 4 * len(world.requests) + 64 + 32
        world.step(held)
