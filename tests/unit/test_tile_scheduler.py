"""Tile scheduler: every tile is served exactly once and in order per request, batches are full when
work is waiting, small requests overtake a large one, and aging stops starvation."""

from hypothesis import given
from hypothesis import strategies as st

from services.stages.tile_scheduler import TileScheduler


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@given(
    st.sampled_from(["fewest_pending", "fifo"]),
    st.integers(1, 8),
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3)), max_size=12),
)
def test_each_tile_once_in_order_and_batches_full(policy, batch_size, arrivals):
    clock = _Clock()
    s = TileScheduler(batch_size, policy, clock=clock)
    served: dict[int, list[int]] = {}
    for key, (n, batches_between) in enumerate(arrivals):
        s.submit(key, list(range(n)))
        for _ in range(batches_between):
            clock.t += 0.01
            pending = s.pending
            batch = s.next_batch()
            assert len(batch) == min(batch_size, pending)
            for k, tile in batch:
                served.setdefault(k, []).append(tile)
    while s.pending:
        for k, tile in s.next_batch():
            served.setdefault(k, []).append(tile)
    for key, (n, _) in enumerate(arrivals):
        assert served.get(key, []) == list(range(n))


def test_small_request_overtakes_a_document_and_aging_prevents_starvation():
    clock = _Clock()
    s = TileScheduler(8, "fewest_pending", aging_tiles_per_s=10, clock=clock)
    s.submit("doc", list(range(200)))
    s.next_batch()
    clock.t = 0.1
    s.submit("chat", [0])
    assert s.next_batch()[0][0] == "chat"  # 1 pending tile beats 192
    # A stream of chats keeps arriving; the document still progresses once it has aged.
    served_doc = 0
    for i in range(100):
        clock.t += 0.1
        s.submit(f"chat{i}", [0])
        served_doc += sum(k == "doc" for k, _ in s.next_batch())
    assert served_doc > 0


def test_fifo_serves_in_arrival_order():
    s = TileScheduler(4, "fifo", clock=_Clock())
    s.submit("doc", list(range(10)))
    s.submit("chat", [0])
    assert {k for k, _ in s.next_batch()} == {"doc"}
