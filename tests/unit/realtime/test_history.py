"""The conversation window's policy: the oldest turns go until the rest fits every limit; once over
one, down to the retention share of each (so the next turns fit without another drop); the newest
turn always stays."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.realtime.history import HistoryLimits, TurnCost, turns_to_drop

TURNS = st.lists(
    st.builds(TurnCost, clips=st.integers(0, 40), messages=st.integers(1, 4), tokens=st.integers(0, 3000)),
    max_size=60,
)
LIMITS = st.builds(
    HistoryLimits,
    turns=st.integers(1, 64),
    clips=st.integers(1, 256),
    messages=st.integers(1, 256),
    tokens=st.integers(-100, 32_768),
    retention=st.floats(0.05, 1.0),
)


def _fits(turns: list[TurnCost], limits: HistoryLimits, share: float = 1.0) -> bool:
    return (
        len(turns) <= limits.turns * share
        and sum(t.clips for t in turns) <= limits.clips * share
        and sum(t.messages for t in turns) <= limits.messages * share
        and sum(t.tokens for t in turns) <= limits.tokens * share
    )


@given(TURNS, LIMITS)
def test_the_rest_fits_keeps_the_newest_turn_and_drops_only_the_oldest(turns, limits):
    dropped = turns_to_drop(turns, limits)
    kept = turns[dropped:]
    assert kept == turns[len(turns) - len(kept) :]  # a suffix: order kept, only the oldest go
    if turns:
        assert kept and kept[-1] is turns[-1]  # the newest turn stays, whatever it costs
    assert _fits(kept, limits) or len(kept) <= 1


@given(TURNS, LIMITS)
def test_nothing_goes_while_all_fits_and_once_over_just_enough_to_reach_the_retention(turns, limits):
    dropped = turns_to_drop(turns, limits)
    if _fits(turns, limits):
        assert dropped == 0
        return
    if len(turns) <= 1:
        assert dropped == 0  # the newest alone stays, over or not
        return
    assert dropped >= 1
    # Within the retention share of every limit (or the newest alone) ...
    assert _fits(turns[dropped:], limits, limits.retention) or dropped == len(turns) - 1
    # ... and no fewer drops would have got there.
    for fewer in range(1, dropped):
        assert not _fits(turns[fewer:], limits, limits.retention)


def test_a_growing_conversation_drops_in_batches():
    """Turn after turn with a limit of 4 turns and a ratio of 0.75: the window goes 1, 2, 3, 4, then
    back to 3 — the prefix changes every second turn, not every turn."""
    limits = HistoryLimits(turns=4, clips=256, messages=256, tokens=10**6, retention=0.75)
    window: list[TurnCost] = []
    sizes = []
    for _ in range(9):
        window.append(TurnCost(clips=2, messages=2, tokens=50))
        window = window[turns_to_drop(window, limits) :]
        sizes.append(len(window))
    assert sizes == [1, 2, 3, 4, 3, 4, 3, 4, 3]


def test_media_items_and_tokens_bound_the_window_too():
    turns = [TurnCost(clips=20, messages=2, tokens=100)] * 5  # 100 clips, 500 tokens
    by_clips = HistoryLimits(turns=64, clips=64, messages=256, tokens=10**6, retention=0.75)
    assert turns_to_drop(turns, by_clips) == 3  # 2 turns = 40 clips <= 48
    by_tokens = HistoryLimits(turns=64, clips=256, messages=256, tokens=450, retention=0.5)
    assert turns_to_drop(turns, by_tokens) == 3  # 200 tokens <= 225
    assert turns_to_drop(turns, HistoryLimits(64, 256, 256, tokens=-5, retention=0.5)) == 4
