from hypothesis import given
from hypothesis import strategies as st

from services.pipeline.text_chunker import TextChunker


def _run(chunker, deltas):
    pieces = [p for d in deltas if (p := chunker.push(d, 1))]
    if (rest := chunker.flush()) is not None:
        pieces.append(rest)
    return pieces


def test_closes_at_clause_boundary_after_min_tokens():
    c = TextChunker(min_tokens=3, max_tokens=10)
    assert _run(c, ["Hi", ",", " there", " you", ".", " Next"]) == ["Hi, there you.", " Next"]


def test_closes_at_max_tokens_without_boundary():
    c = TextChunker(min_tokens=2, max_tokens=3)
    assert _run(c, ["a", "b", "c", "d", "e"]) == ["abc", "de"]


@given(st.lists(st.text(min_size=0, max_size=6), max_size=60), st.integers(1, 5), st.integers(0, 10))
def test_pieces_reassemble_the_answer_and_respect_max(deltas, lo, extra):
    c = TextChunker(min_tokens=lo, max_tokens=lo + extra)
    pieces = [p for d in deltas if (p := c.push(d, 1))]
    assert all(p.strip() for p in pieces)
    rest = c.flush()
    text = "".join(pieces) + (rest or "")
    joined = "".join(deltas)
    # Only whitespace-only tails are dropped.
    assert joined.startswith(text) and not joined[len(text) :].strip()
