"""The gateway's view of encoder overload (services/router/encoder_load.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.router.encoder_load import EncoderLoad


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_overload_begins_past_the_bound_and_ends_below_half_of_it():
    clock = Clock()
    load = EncoderLoad(1.0, smoothing=1.0, clock=clock)
    assert not load.overloaded
    load.observe(1.5)
    assert load.overloaded
    load.observe(0.8)  # under the bound, over half of it: still overloaded (no flapping)
    assert load.overloaded
    load.observe(0.4)
    assert not load.overloaded
    load.observe(0.8)  # back under the bound from below: not overloaded
    assert not load.overloaded


def test_a_drained_pool_reads_as_drained_without_new_requests():
    clock = Clock()
    load = EncoderLoad(1.0, smoothing=1.0, clock=clock)
    load.observe(3.0)
    assert load.overloaded
    clock.now = 3.0  # three bounds later: 3 s halved three times
    assert not load.overloaded


def test_no_bound_never_overloads():
    load = EncoderLoad(None)
    load.observe(1e6)
    assert not load.overloaded


@given(st.lists(st.floats(0, 100), max_size=30))
def test_the_smoothed_wait_stays_within_what_was_observed(waits):
    load = EncoderLoad(1.0, clock=Clock())
    for w in waits:
        load.observe(w)
    assert 0 <= load.wait_s <= max(waits, default=0.0)


def test_only_requests_below_realtime_get_the_overload_policy():
    clock = Clock()
    load = EncoderLoad(1.0, overload_max_tiles=4, smoothing=1.0, clock=clock)
    assert load.max_tiles("interactive") is None
    load.observe(2.0)
    assert load.max_tiles("interactive") == load.max_tiles("batch") == 4
    assert load.max_tiles("realtime") is None
    clock.now = 10.0  # drained
    assert load.max_tiles("interactive") is None
