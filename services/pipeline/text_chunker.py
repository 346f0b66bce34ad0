"""Async chunk: cut the streamed answer into text pieces the talker can start on.

A piece closes at a clause boundary once it holds `min_tokens` tokens, or at `max_tokens` regardless,
so the first audio does not wait for the whole answer and pieces still sound like phrases.
"""

from __future__ import annotations

BOUNDARIES = frozenset(".!?;:,\n")


class TextChunker:
    def __init__(self, min_tokens: int, max_tokens: int):
        if not 1 <= min_tokens <= max_tokens:
            raise ValueError("need 1 <= min_tokens <= max_tokens")
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens
        self._text = ""
        self._tokens = 0

    def push(self, text: str, n_tokens: int) -> str | None:
        """Add decoded text; returns a finished piece when one closes."""
        self._text += text
        self._tokens += n_tokens
        stripped = self._text.rstrip()
        at_boundary = bool(stripped) and stripped[-1] in BOUNDARIES
        # Whitespace alone is never a piece: it stays buffered and leads the next one.
        if stripped and (
            (self._tokens >= self.min_tokens and at_boundary) or self._tokens >= self.max_tokens
        ):
            return self.flush()
        return None

    def flush(self) -> str | None:
        """The remaining text (end of answer), if any."""
        piece, self._text, self._tokens = self._text, "", 0
        return piece if piece.strip() else None
