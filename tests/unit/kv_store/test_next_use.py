"""Next-use policy: the victim is the page used furthest in the future, suffix before prefix, and
predictions can change at any time (update) without scans."""

import math

from hypothesis import given
from hypothesis import strategies as st

from kv_store.eviction import PageInfo, create


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["insert", "update", "remove"]),
            st.integers(0, 40),
            st.one_of(st.floats(0, 1000), st.just(math.inf)),
            st.integers(0, 8),
        ),
        max_size=150,
    )
)
def test_victim_matches_a_full_scan(ops):
    predicted: dict = {}
    policy = create("next_use", predict=lambda page: predicted[page])
    present: dict = {}
    for op, page, next_use, position in ops:
        if op == "insert":
            predicted[page] = next_use
            policy.insert(page, PageInfo(position=position))
            present[page] = position
        elif op == "update" and page in present:
            predicted[page] = next_use
            policy.update(page)
        elif op == "remove":
            policy.remove(page)
            present.pop(page, None)
        scan = max(present, key=lambda p: (predicted[p], present[p]), default=None)
        got = policy.victim()
        if scan is None:
            assert got is None
        else:
            assert (predicted[got], present[got]) == (predicted[scan], present[scan])


def test_a_session_that_starts_speaking_is_protected():
    next_use = {"s1/p0": 30.0, "s1/p1": 30.0, "s2/p0": 5.0}
    policy = create("next_use", predict=next_use.__getitem__)
    for page in next_use:
        policy.insert(page, PageInfo(position=int(page[-1])))
    assert policy.victim() == "s1/p1"  # furthest next use; suffix before prefix
    next_use.update({"s1/p0": 0.0, "s1/p1": 0.0})  # session 1 started speaking
    policy.update_many(["s1/p0", "s1/p1"])
    assert policy.victim() == "s2/p0"
