"""Chained page hashes: page i's hash covers page i-1's hash and its own content, so equal hashes
mean equal prefixes, and any process can match a prefix by hashing its own prompt.

A prompt is a sequence of token ids and media spans. A media span's tokens are represented by the
media's content hash, its encoder version and the token's offset inside the span, so the same image
(same bytes, same encoder) at the same place in the same context gives the same pages, and a new
encoder or LLM version never matches old pages. Only full pages are hashed: a partial last page is
not shareable.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class MediaSpan:
    content_hash: str
    encoder_version: str
    num_tokens: int


Segment = list[int] | MediaSpan


def _elements(segments: list[Segment]) -> Iterator[bytes]:
    for seg in segments:
        if isinstance(seg, MediaSpan):
            head = f"m:{seg.content_hash}:{seg.encoder_version}:".encode()
            for i in range(seg.num_tokens):
                yield head + struct.pack("<I", i)
        else:
            for token in seg:
                yield struct.pack("<q", token)


def page_hashes(segments: list[Segment], page_tokens: int, llm_version: str) -> list[str]:
    """Hex sha256 per full page, chained from a root that is the LLM version."""
    prev = hashlib.sha256(f"omniray-kv:{llm_version}".encode()).digest()
    out: list[str] = []
    page = hashlib.sha256(prev)
    n = 0
    for element in _elements(segments):
        page.update(len(element).to_bytes(2, "little") + element)
        n += 1
        if n == page_tokens:
            prev = page.digest()
            out.append(prev.hex())
            page, n = hashlib.sha256(prev), 0
    return out
