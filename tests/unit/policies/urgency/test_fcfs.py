from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.policies import urgency


@given(st.lists(st.floats(0, 1e6), max_size=50))
def test_fcfs_is_arrival_order_and_holds_nothing(arrivals):
    r = urgency.create("fcfs").rank([urgency.Candidate(a, 0, 0, None) for a in arrivals], 0.0, 0.0)
    assert [arrivals[i] for i in r.order] == sorted(arrivals) and r.held == []
