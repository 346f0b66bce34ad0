"""Chained page hashes: page i's hash covers page i-1's hash and its own content, so equal hashes
mean equal prefixes, and any process can match a prefix by hashing its own prompt.

A prompt is a sequence of token ids and media spans. A media span's tokens are represented by the
media's content hash, its encoder version and the token's offset inside the span, so the same image
(same bytes, same encoder) at the same place in the same context gives the same pages, and a new
encoder or LLM version never matches old pages. Full pages are what prefixes share; a partial last
page has its own hash too (it covers exactly its tokens), used to hand a whole prompt from prefill to
decode.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class MediaSpan:
    content_hash: str
    encoder_version: str
    num_tokens: int


Segment = list[int] | MediaSpan


def elements(segments: Iterable[Segment]) -> Iterator[bytes]:
    for seg in segments:
        if isinstance(seg, MediaSpan):
            head = f"m:{seg.content_hash}:{seg.encoder_version}:".encode()
            for i in range(seg.num_tokens):
                yield head + struct.pack("<I", i)
        else:
            yield from token_elements(seg)


def token_elements(token_ids: Iterable[int]) -> Iterator[bytes]:
    for token in token_ids:
        yield struct.pack("<q", token)


class ChainHasher:
    """Incremental chained hashing: feed elements as a sequence grows (prompt, then generated
    tokens); `pages` holds the hashes of the full pages so far."""

    def __init__(self, page_tokens: int, llm_version: str, salt: str = ""):
        self.page_tokens = page_tokens
        self.pages: list[str] = []
        root = f"omniray-kv:{llm_version}" + (f":{salt}" if salt else "")
        self._prev = hashlib.sha256(root.encode()).digest()
        self._page = hashlib.sha256(self._prev)
        self.tail_tokens = 0  # elements in the current, partial page
        self.tokens = 0

    def feed(self, items: Iterable[bytes]) -> None:
        for element in items:
            self._page.update(len(element).to_bytes(2, "little") + element)
            self.tail_tokens += 1
            self.tokens += 1
            if self.tail_tokens == self.page_tokens:
                self._prev = self._page.digest()
                self.pages.append(self._prev.hex())
                self._page, self.tail_tokens = hashlib.sha256(self._prev), 0

    def tail(self) -> str | None:
        """The partial last page's hash (None when the sequence ends on a page boundary)."""
        if not self.tail_tokens:
            return None
        # A partial page can never equal a full page: the count is part of what is hashed.
        page = self._page.copy()
        page.update(b"partial:" + self.tail_tokens.to_bytes(4, "little"))
        return page.hexdigest()


def page_hashes(segments: list[Segment], page_tokens: int, llm_version: str, salt: str = "") -> list[str]:
    """Hex sha256 per full page, chained from a root that is the LLM version (and the salt: a tenant
    whose pages must not be shared with others)."""
    hasher = ChainHasher(page_tokens, llm_version, salt)
    hasher.feed(elements(segments))
    return hasher.pages
