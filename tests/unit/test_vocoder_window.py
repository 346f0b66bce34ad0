"""VocoderWindow: every unit is decoded exactly once, in order, with exactly the context it needs."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from services.pipeline.vocoder_window import VocoderWindow


@given(
    st.integers(0, 8),
    st.integers(0, 8),
    st.lists(st.integers(0, 20), max_size=15),
)
def test_units_decoded_once_in_order_with_their_context(context, lookahead, sizes):
    units = np.arange(sum(sizes))
    window = VocoderWindow(context, lookahead)
    calls, start = [], 0
    for size in sizes:
        calls.append(window.push(units[start : start + size]))
        start += size
    calls.append(window.flush())
    calls = [c for c in calls if c]
    decoded = np.concatenate([c.units for c in calls]) if calls else units[:0]
    np.testing.assert_array_equal(decoded, units)
    for c in calls:
        first, last = c.units[0], c.units[-1]
        left = units[max(0, first - context) : first]
        np.testing.assert_array_equal(c.left if c.left is not None else units[:0], left)
        if c is not calls[-1]:  # only the flush may lack lookahead
            np.testing.assert_array_equal(
                c.right if c.right is not None else units[:0], units[last + 1 : last + 1 + lookahead]
            )
        assert len(c.units) > 0


def test_holds_back_lookahead_until_flush():
    window = VocoderWindow(context=2, lookahead=3)
    assert window.push(np.arange(3)) is None
    call = window.push(np.arange(3, 5))
    np.testing.assert_array_equal(call.units, [0, 1])
    np.testing.assert_array_equal(call.right, [2, 3, 4])
    last = window.flush()
    np.testing.assert_array_equal(last.units, [2, 3, 4])
    np.testing.assert_array_equal(last.left, [0, 1])
    assert last.right is None and window.flush() is None
