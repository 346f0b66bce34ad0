"""AIMD admission: the limit stays in its bounds, shrinks multiplicatively while frames are late,
grows by the step while they are on time, and never admits more sessions than it allows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.sessions.admission import AdmissionParams, AimdAdmission


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
