"""LiveServe urgency: U0 (playing, low buffer) before U1 (no first audio, by age) before U2 (well
buffered, by score); far-ahead U2 held; stale or missing telemetry is U1 (FCFS among them)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.playback.board import BoardView
from services.policies import urgency
from services.policies.urgency.liveserve import LiveServeParams
from services.policies.urgency.plan import UrgencyPlan

NOW = 1000.0


def view(buffered_ms=0.0, first_audio=True, barge_ins=0, responses=1, at=NOW) -> BoardView:
    return BoardView(session_id="s", played_ms=0.0, age_s=0.0, ms_per_token=None, buffered_ms=buffered_ms, playing=buffered_ms > 0, speaking=False, responding=True,
                     first_audio=first_audio, barge_ins=barge_ins, responses=responses,
                     reply_gap_ms=None, at=at)  # fmt: skip


def cand(arrival, v=None, kv=100, generated=0):
    return urgency.Candidate(arrival=arrival, kv_tokens=kv, generated=generated, view=v)


def test_classes_and_order():
    policy = urgency.create("liveserve", {"safe_ms": 1000, "hold_ms": 5000})
    c = [
        cand(1, view(3000)),  # U2
        cand(2, None),  # U1 (not a realtime session)
        cand(3, view(200)),  # U0, emptier
        cand(4, view(900)),  # U0
        cand(5, view(0, first_audio=False)),  # U1, younger
        cand(6, view(3000), generated=100),  # held: 100 tokens x 150 ms, nothing played yet
        cand(0.5, None),  # stale telemetry (the board reader dropped it): U1, oldest
    ]
    r = policy.rank(c, NOW, occupancy=0.5)
    assert r.classes == ["U2", "U1", "U0", "U0", "U1", "held", "U1"]
    assert r.order == [2, 3, 6, 1, 4, 0] and r.held == [5]


def test_generation_ahead_of_playback_is_held_until_playback_catches_up():
    policy = urgency.create("liveserve", {"safe_ms": 1000, "hold_ms": 5000, "ms_per_token": 100})
    ahead = cand(1, view(3000), generated=80)  # 8 s generated, nothing played
    assert policy.rank([ahead], NOW, 0.0).held == [0]
    early = view(0, first_audio=False)  # no audio yet: never held (it may need tokens to start)
    assert policy.rank([cand(1, early, generated=80)], NOW, 0.0).classes == ["U1"]
    low = view(500)  # running low: never held either
    assert policy.rank([cand(1, low, generated=80)], NOW, 0.0).classes == ["U0"]
    played = view(3000, at=NOW - 3.5)  # 3 s played since (all it had): 5 s ahead, buffer empty
    assert policy.rank([cand(1, played, generated=80)], NOW, 0.0).classes == ["U0"]
    measured = BoardView(**{**view(3000).__dict__, "ms_per_token": 50.0})  # this session: 4 s ahead
    assert policy.rank([cand(1, measured, generated=80)], NOW, 0.0).classes == ["U2"]


def test_a_well_buffered_request_is_paced_to_playback():
    params = {"safe_ms": 1000, "hold_ms": 5000, "resume_ms": 2000, "ms_per_token": 100, "lead_ms": 0}
    policy = urgency.create("liveserve", params)
    c = policy.classify(cand(1, view(9000), generated=60), NOW, 0.0)  # 6 s generated, nothing played
    assert c.cls == "U2" and c.until == pytest.approx(NOW + 8.0)  # its buffer falls to safe_ms
    pace = c.pace
    assert pace.holds(60, NOW) and pace.release_at(pace.ahead(60, NOW), NOW) == pytest.approx(NOW + 3.0)
    assert (
        not pace.holds(60, NOW + 3.0)
        and pace.rounds_to_hold(pace.ahead(60, NOW + 3.0), NOW + 3.0, 1, 0.0) == 21
    )  # 2 s of tokens


def test_a_due_refill_may_run_a_piece_further():
    params = {"safe_ms": 1000, "hold_ms": 5000, "resume_ms": 2000, "ms_per_token": 100, "lead_ms": 0}
    policy = urgency.create("liveserve", params, piece_tokens=10)  # a piece: 1 s of audio
    # 5.5 s generated, 3 s at the client: over its hold of 5 s; the refill is due in 2 s (safe_ms)
    pace = policy.classify(cand(1, view(3000), generated=55), NOW, 0.0).pace
    assert pace.holds(55, NOW) and pace.hold_at(NOW) == 5000 and pace.hold_at(NOW + 2.0) == 6000
    # released when due (it is back within hold + piece by then), not 0.5 s later back within 5 s
    assert pace.release_at(pace.ahead(55, NOW), NOW) == pytest.approx(NOW + 2.0)
    # 7.1 s generated: with 1.9 s played, over 5 s; with 2 s played, due and within 6 s
    assert pace.holds(71, NOW + 1.9) and not pace.holds(71, NOW + 2.0) and pace.holds(81, NOW + 2.0)
    # a running due refill is checked when it may be over a piece more: 3.5 s ahead, 25 tokens to go
    assert pace.rounds_to_hold(pace.ahead(55, NOW + 2.0), NOW + 2.0, 1, 0.0) == 26


def with_gap(v: BoardView, reply_gap_ms: float) -> BoardView:
    return BoardView(**{**v.__dict__, "reply_gap_ms": reply_gap_ms})


def test_a_held_request_is_released_before_its_buffer_runs_low():
    policy = urgency.create(
        "liveserve",
        {"safe_ms": 1000, "hold_ms": 5000, "resume_ms": 2000, "ms_per_token": 100, "lead_ms": 250},
    )
    # 6 s generated, 3 s of it at the client; held over hold_ms + lead_ms (5.25 s). Its buffer
    # reaches safe_ms in 2 s, before it falls resume_ms below that (in 2.75 s): it is released
    # lead_ms before its buffer gets there
    c = policy.classify(cand(1, view(3000), generated=60), NOW, 0.0)
    assert c.until == pytest.approx(NOW + 2.0) and c.pace.holds(60, NOW)
    assert c.pace.release_at(c.pace.ahead(60, NOW), NOW) == pytest.approx(NOW + 1.75)
    # a session whose audio takes 1.5 s to come through (its reply gap) has more in flight: it may
    # run 1.5 s further ahead, and is released as soon as it is back within that
    slow = policy.classify(cand(1, with_gap(view(3000), 1500), generated=60), NOW, 0.0)
    assert not slow.pace.holds(60, NOW) and slow.pace.holds(66, NOW)
    assert slow.pace.release_at(slow.pace.ahead(80, NOW), NOW) == pytest.approx(NOW + 1.5)
    # a reply gap shorter than lead_ms does not shorten it
    fast = policy.classify(cand(1, with_gap(view(3000), 50), generated=60), NOW, 0.0)
    assert fast.pace.release_at(fast.pace.ahead(60, NOW), NOW) == pytest.approx(NOW + 1.75)


def test_well_buffered_requests_yield_to_new_turns_until_their_refill_is_due():
    params = {"safe_ms": 1000, "hold_ms": 5000, "ms_per_token": 100, "lead_ms": 250}
    policy = urgency.create("liveserve", params)
    assert policy.classify(cand(1, view(0, first_audio=False)), NOW, 0.0).turn  # a realtime turn
    assert not policy.classify(cand(1, None), NOW, 0.0).turn  # not a realtime session: no turn
    # 3 s buffered: safe_ms in 2 s, the refill due lead_ms before that
    calm = policy.classify(cand(1, view(3000), generated=10), NOW, 0.0)
    at, due = calm.rekey
    assert calm.key >= policy.yields_from and at == pytest.approx(NOW + 1.75)
    assert due < policy.yields_from and due[2:] == calm.key[2:]  # from then on: first among U2
    assert calm.until == pytest.approx(NOW + 2.0)  # U0 then
    # classified once it is due: keyed so directly
    late = policy.classify(cand(1, view(3000), generated=10), NOW + 1.8, 0.0)
    assert late.key[:2] == (2, 0) and late.rekey is None
    for low in (view(1000), view(0, first_audio=False), None):  # U0, U1: never yield
        assert policy.classify(cand(1, low), NOW, 0.0).key < policy.yields_from
    off = urgency.create("liveserve", {**params, "yield_to_turns": False})
    assert off.yields_from is None and off.classify(cand(1, view(3000), generated=10), NOW, 0.0).rekey is None
    assert urgency.create("fcfs").yields_from is None


def test_buffer_drains_in_real_time_between_views():
    policy = urgency.create("liveserve", {"safe_ms": 1000, "hold_ms": 5000})
    c = [cand(1, view(2500, at=NOW - 1.6))]  # 900 ms left now: U0
    assert policy.rank(c, NOW, 0.0).classes == ["U0"]


def test_u2_prefers_big_kv_holders_when_memory_is_scarce_and_rare_barge_ins():
    policy = urgency.create("liveserve", {"safe_ms": 100, "hold_ms": 10_000, "alpha": 1, "beta": 1})
    big, small = cand(1, view(3000), kv=8000), cand(0.5, view(3000), kv=100)
    assert policy.rank([small, big], NOW, occupancy=0.9).order == [1, 0]
    assert policy.rank([small, big], NOW, occupancy=0.0).order == [0, 1]  # ties: by age
    barger = cand(0, view(3000, barge_ins=3, responses=3), kv=100)
    calm = cand(5, view(3000), kv=100)
    assert policy.rank([barger, calm], NOW, occupancy=0.5).order == [1, 0]


@pytest.mark.parametrize(
    "params",
    [
        {"safe_ms": 5000, "hold_ms": 100},
        {"alpha": -1},
        {"resume_ms": 3000},
        {"resume_ms": -1},
        {"lead_ms": -1},
        {"nope": 1},
    ],
)
def test_bad_parameters_are_refused(params):
    with pytest.raises((ValueError, TypeError)):
        urgency.create("liveserve", params)


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown urgency policy"):
        urgency.create("edf")


VIEWS = st.one_of(
    st.none(),
    st.builds(
        view,
        buffered_ms=st.floats(0, 20_000),
        first_audio=st.booleans(),
        barge_ins=st.integers(0, 5),
        responses=st.integers(0, 5),
        at=st.floats(NOW - 5, NOW),
    ),
)


ITEMS = st.tuples(st.floats(0, 100), VIEWS, st.integers(0, 100_000), st.integers(0, 500))


@given(st.lists(ITEMS, max_size=60), st.floats(0, 1))
def test_ranking_is_a_partition_and_classes_are_ordered(items, occupancy):
    policy = urgency.create("liveserve", {})
    c = [cand(a, v, kv, gen) for a, v, kv, gen in items]
    r = policy.rank(c, NOW, occupancy)
    assert sorted(r.order + r.held) == list(range(len(c)))  # every request once: none lost
    rank = {"U0": 0, "U1": 1, "U2": 2}
    ordered = [rank[r.classes[i]] for i in r.order]
    assert ordered == sorted(ordered)
    u0 = [c[i].view.buffered_at(NOW) for i in r.order if r.classes[i] == "U0"]
    assert u0 == sorted(u0)  # emptiest buffer first
    u1 = [c[i].arrival for i in r.order if r.classes[i] == "U1"]
    assert u1 == sorted(u1)  # oldest first
    p = LiveServeParams()
    for i in r.held:
        v = c[i].view
        assert c[i].generated * (v.ms_per_token or p.ms_per_token) - v.played_at(NOW) > p.hold_ms


def _longest_stall_s(piece_tokens: int, frame_s: float, latency_s: float) -> float:
    """One reply of 10 pieces through the engine's plan (services/policies/urgency/plan.py): a
    token a round while it is not held; a piece's audio (24 tokens × 300 ms) reaches the client
    `latency_s` after its last token (the talker speaks whole text pieces); the client plays in real
    time; its board view says where it is each round, with the reply gap the true latency. Returns
    the longest stretch the client's buffer sat empty before the reply's last audio came."""
    piece, ms_per_token = 24, 300.0
    policy = urgency.create(
        "liveserve", {"lead_ms": 250, "ms_per_token": ms_per_token}, piece_tokens=piece_tokens
    )
    request, progress = object(), {"generated": piece}  # the first piece generated and heard
    plan = UrgencyPlan(
        policy, lambda r: ("s", NOW), lambda r: (1000 + progress["generated"], progress["generated"])
    )
    now, buffered, played, arriving = NOW, piece * ms_per_token, 0.0, []
    stall = longest = 0.0
    while progress["generated"] < 10 * piece or arriving:
        v = BoardView(session_id="s", played_ms=played, age_s=0.0, ms_per_token=ms_per_token, buffered_ms=buffered,
                      playing=buffered > 0, speaking=False, responding=True, first_audio=True, barge_ins=0,
                      responses=1, reply_gap_ms=latency_s * 1000, at=now)  # fmt: skip
        order, _ = plan.arrange([request], {"s": v}, now, 0.0)
        if order and progress["generated"] < 10 * piece:
            progress["generated"] += 1
            if progress["generated"] % piece == 0:
                arriving.append(now + latency_s)
        now += frame_s
        while arriving and arriving[0] <= now:
            arriving.pop(0)
            buffered += piece * ms_per_token
        step_ms = frame_s * 1000
        stall = stall + (step_ms - min(buffered, step_ms)) / 1000 if buffered < step_ms else 0.0
        longest = max(longest, stall)
        played += min(buffered, step_ms)
        buffered = max(0.0, buffered - step_ms)
    return longest


def test_a_reply_paced_partway_through_a_piece_keeps_its_client_playing():
    """A talker that speaks whole text pieces gives no audio for a piece until its last token. Paced
    to `hold_ms` + the lead alone, the reply is held partway through a piece, then let run a token
    at a time as playback catches up, i.e. at real time, while its client's buffer drains: the
    piece ends too late, the later the slower the engine and the pipeline (a third of a second at
    45 ms a token and 1.2 s from a piece's end to its audio). With a piece more in its hold once its
    refill is due (24 tokens a piece, streamed 8 at a time: Profile.audio_piece_tokens), it always
    finishes the piece in time."""
    assert _longest_stall_s(0, frame_s=0.045, latency_s=1.2) > 0.2
    assert _longest_stall_s(0, frame_s=0.06, latency_s=1.5) > _longest_stall_s(0, frame_s=0.03, latency_s=1.0)
    for frame_s in (0.015, 0.045, 0.06):
        for latency_s in (0.3, 1.2, 1.5):
            assert _longest_stall_s(24 + 8 - 1, frame_s, latency_s) == 0.0
