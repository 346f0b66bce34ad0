"""AIMD admission: the limit stays in its bounds, shrinks multiplicatively while frames are late,
grows by the step while they are on time, and never admits more sessions than it allows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.policies.admission import AdmissionParams, AimdAdmission


def test_late_frames_shrink_the_limit_and_on_time_frames_grow_it():
    a = AimdAdmission(AdmissionParams(initial=10, min=2, max=12, increase=1, decrease=0.5, window=4))
    for _ in range(4):
        a.observe(3.0)  # delivered three times slower than played
    assert a.limit == 5
    for _ in range(8):
        a.observe(3.0)
    assert a.limit == 2  # floor
    for _ in range(4 * 20):
        a.observe(0.5)
    assert a.limit == 12  # ceiling


def test_surplus_sessions_are_refused_until_one_leaves():
    a = AimdAdmission(AdmissionParams(initial=2))
    assert a.try_admit() and a.try_admit()
    assert not a.try_admit()
    a.release()
    assert a.try_admit()


@given(
    st.lists(st.one_of(st.floats(0, 10), st.just("admit"), st.just("release")), max_size=300),
    st.floats(1, 8),
    st.floats(8, 64),
)
def test_limit_in_bounds_and_admitted_never_over_it(ops, low, high):
    a = AimdAdmission(AdmissionParams(initial=8, min=low, max=high, window=5))
    for op in ops:
        if op == "admit":
            before = a.active
            if a.try_admit():
                assert a.active == before + 1 <= int(a.limit)
        elif op == "release":
            a.release()
        else:
            a.observe(op)
        assert low <= a.limit <= high and a.active >= 0


@settings(max_examples=40, deadline=None)
@given(n_star=st.integers(2, 60), decrease=st.floats(0.8, 0.95), window=st.integers(5, 60))
def test_limit_settles_at_the_capacity_of_a_synthetic_latency_curve(n_star, decrease, window):
    """Frames are on time (ratio 0.5) while at most N* sessions run and late (1.5) beyond; arrivals
    keep the sessions at the limit. After the climb the limit saws between decrease·(N*+1) and
    N*+2 (a window that saw only a few late frames still grows it), and the sessions it admits
    average N* ± 15% (± one session)."""
    ctl = AimdAdmission(AdmissionParams(initial=1, min=1, max=4 * n_star, decrease=decrease, window=window))
    limits = []
    for _ in range(200 * window):
        while ctl.try_admit():  # arrivals fill every free slot
            pass
        ctl.observe(1.5 if ctl.active > n_star else 0.5)
        if ctl.active > int(ctl.limit):  # sessions end; the surplus over a lowered limit leaves first
            ctl.release()
        limits.append(ctl.limit)
    settled = limits[len(limits) // 2 :]
    assert min(settled) >= decrease * (n_star + 1) - 1e-9
    assert max(settled) < n_star + 2
    admitted = [int(x) for x in settled]
    assert abs(sum(admitted) / len(admitted) - n_star) <= 0.15 * n_star + 1
