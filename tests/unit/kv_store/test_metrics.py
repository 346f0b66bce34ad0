"""The store's metrics recorded in an engine process and replayed in the serving one give the same
totals as recording there directly, however the recordings are split and merged."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kv_store import metrics

CALLS = st.lists(
    st.one_of(
        st.tuples(st.just("lookup"), st.tuples(st.sampled_from(["L2", "miss"])), st.integers(1, 5)),
        st.tuples(st.just("moved"), st.tuples(st.sampled_from(["peer->L2", "L1->L2"])), st.integers(0, 4096)),
        st.tuples(st.just("occupancy"), st.tuples(st.just("L2")), st.floats(0, 1)),
        st.tuples(st.just("transfer"), st.tuples(st.just("peer->L2")), st.floats(0, 1)),
        st.tuples(
            st.just("request"), st.tuples(st.just("pd"), st.sampled_from(["hit", "miss"])), st.integers(0, 99)
        ),
    ),
    max_size=40,
)


@given(CALLS, st.integers(0, 40))
def test_recorded_split_merged_and_replayed_equals_direct(calls, cut):
    direct = metrics.Totals()
    first, second = metrics.Recorder(), metrics.Recorder()
    for i, (method, labels, value) in enumerate(calls):
        getattr(direct, method)(*labels, value)
        getattr(first if i < cut else second, method)(*labels, value)
    replayed = metrics.Totals()
    metrics.replay(metrics.merge(first.drain(), second.drain()), replayed)
    assert replayed.values.keys() == direct.values.keys()
    for key, value in direct.values.items():
        assert abs(replayed.values[key] - value) < 1e-6 * max(1.0, abs(value))
    assert first.drain() == {}  # drained means empty
