"""Cutting an assistant item to what was played: whole pieces played, the played share of the piece
playing then (at a word), nothing generated but unspoken; cuts repeat from what was generated."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.realtime.session import Item


def _item(pieces: list[tuple[str, float]], unspoken: str = "") -> Item:
    item = Item("i", "assistant", spoken=[[t, ms] for t, ms in pieces])
    item.generated = item.text = "".join(t for t, _ in pieces) + unspoken
    return item


def test_cut_keeps_played_pieces_and_the_played_words_of_the_current_one():
    item = _item([("Hello there. ", 1000), ("How are you today? ", 2000)], unspoken="I am fine")
    item.cut(2100)  # the first piece, and 55% of the second
    assert item.text == "Hello there. How are"
    item.cut(3000)  # a later cut starts again from what was generated
    assert item.text == "Hello there. How are you today? "
    item.cut(0)
    assert item.text == ""


PIECES = st.lists(st.tuples(st.text(alphabet="ab ", min_size=1, max_size=20), st.floats(1, 3000)), max_size=8)


@given(PIECES, st.text(alphabet="ab ", max_size=20), st.floats(0, 30_000), st.floats(0, 30_000))
def test_a_cut_is_a_prefix_growing_with_the_played_audio(pieces, unspoken, a, b):
    item = _item(pieces, unspoken)
    spoken = "".join(t for t, _ in pieces)
    item.cut(min(a, b))
    shorter = item.text
    item.cut(max(a, b))
    assert spoken.startswith(item.text) and item.text.startswith(shorter)
    item.cut(item.audio_ms)
    assert item.text == spoken  # all audio played: all spoken text, nothing unspoken
