"""IndexedHeap: after any mix of pushes, key changes and removals, the top is the minimum."""

from hypothesis import given
from hypothesis import strategies as st

from kv_store.eviction.indexed_heap import IndexedHeap

ops = st.lists(
    st.tuples(st.sampled_from(["push", "remove"]), st.integers(0, 30), st.integers(-50, 50)), max_size=200
)


@given(ops)
def test_top_is_always_the_minimum(operations):
    heap, ref = IndexedHeap(), {}
    for op, item, key in operations:
        if op == "push":
            heap.push(item, (key, item))
            ref[item] = (key, item)
        else:
            heap.remove(item)
            ref.pop(item, None)
        assert len(heap) == len(ref)
        assert heap.peek() == (min(ref, key=ref.get) if ref else None)
