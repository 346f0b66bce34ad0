from hypothesis import given
from hypothesis import strategies as st

from kv_store.eviction import PageInfo, create


@given(st.lists(st.tuples(st.sampled_from(["insert", "touch", "remove"]), st.integers(0, 20)), max_size=100))
def test_victim_is_least_recently_used(ops):
    lru, ref = create("lru"), {}
    for clock, (op, page) in enumerate(ops):
        if op == "insert":
            lru.insert(page, PageInfo())
            ref[page] = clock
        elif op == "touch":
            lru.touch(page)
            if page in ref:
                ref[page] = clock
        else:
            lru.remove(page)
            ref.pop(page, None)
        assert lru.victim() == (min(ref, key=ref.get) if ref else None)
