"""A response's thinker tokens, from the decode stage straight to the talker stage (a token talker,
Qwen3-Omni's, reads them as they are written): a Redis stream per response, so whichever replicas
serve the two calls find each other, and nothing passes through the gateway.

Decode appends, first, the thinker's hidden states at the prompt's media placeholders when the prompt
has media (the talker's input, services/extensions/vllm/media_rows.py), then each chunk's token ids,
and when the response ends an end entry (or an error entry); the talker reads from the start with
bounded blocking reads. A decode lost mid-response (its replica killed or stalled, or its request
given up by its engine) writes no end: the decode that resumes it (services/pipeline/pipeline.py
`_decode`) appends to the same stream after what is there (`TokenStreamWriter.take_over`). Each
decode of a response writes under its own epoch (entry ids `<epoch>-<n>`; the epoch counts the
response's decodes, DecodeRequest.attempt) behind a fence entry (`<epoch>-0`), so a lost decode
that runs on later (a stalled replica let go) has every write refused by Redis rather than
interleaved with its successor's; and the successor lines the stream up with the answer the gateway
has: a lost decode may have written tokens the gateway never received (written before they were
sent), which its successor generates again — those it does not write a second time, so the talker
speaks each position of the answer once. The stream expires a while after its last write (the
decode stage keeps it as long as a resume may take on top: `PipelineSpec.thinker_gap_s`), so an
abandoned one does not stay.

The stream is speech's side channel: a slow Redis answer (a loaded node) is retried for a few
seconds, and a Redis that stays away breaks the stream, not the response — decode's text goes on,
the talker's read times out and the speech fails alone.

Known limit: where a lost decode wrote tokens the gateway never received, the talker speaks those
(the lost decode's) and the text has its successor's for the same positions — the same tokens under
greedy sampling, up to a chunk of different ones otherwise; where a tool call's marker is among
those, the talker may stop where the text goes on, or speak into a call the text has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import numpy as np
import redis

from services.common.redis_config import UNAVAILABLE, async_client

PREFIX = "omniray:tokens:"
TTL_S = 120
# One blocking read: below the client's socket timeout (a longer block would read as a stalled Redis).
BLOCK_MS = 200
# How long one write keeps retrying slow answers (each bounded by the client's socket timeout).
WRITE_DEADLINE_S = 5.0
RETRY_PAUSE_S = 0.05
# How a resumed decode took the lost one's stream over (omniray_decode_stream_takeovers_total): as it
# was, skipping tokens it held past the answer sent, writing tokens it lacked; or a decode's writes
# were refused, a later one having taken over.
TAKEOVERS = ("continued", "overlap", "filled", "fenced")
log = logging.getLogger(__name__)


def key(request_id: str) -> str:
    return PREFIX + request_id


class TokenStreamWriter:
    """One decode's writes to a response's stream; `attempt`: which decode of the response it is (0
    the first, n the n-th resumed: DecodeRequest.attempt, set by the gateway, so a later decode's
    epoch is higher whichever of them takes the stream over last)."""

    def __init__(self, stream: str, client=None, ttl_s: float = TTL_S, attempt: int = 0):
        self.stream, self.ttl_s = stream, int(ttl_s)
        self.redis = client or async_client()
        self._epoch, self._seq = attempt + 1, 0  # ids <epoch>-<n>; 0-0 is no stream id
        self._skip = 0  # tokens the stream already holds past the answer (take_over)
        self._missing: list[int] = []  # tokens of the answer the stream lacks (take_over)
        # a write failed for good, or a later decode took the stream over: the rest are dropped
        self.broken = False
        self.fenced = False  # a later decode took the stream over
        self.takeover = ""  # a resumed decode's take-over of the lost one's stream: TAKEOVERS[:3]
        self.overlap = 0  # tokens the lost decode held past the answer sent

    async def take_over(self, answered: list[int] | None = None) -> bool:
        """Start this decode's writes, fencing off any earlier decode of the response (its later
        writes are refused), and line the stream up with `answered` — the answer's tokens the
        gateway has, which a resumed decode's prompt ends with: tokens held past them are not
        written again, tokens missing from it go ahead of this decode's first. Whether an earlier
        decode wrote anything (then the talker has the media rows). A Redis that stays away breaks
        the stream, as a write would; a later decode's fence, found here, too."""
        deadline = time.monotonic() + WRITE_DEADLINE_S
        self._seq = -1
        # `ids` empty: a reader that knows no fences reads no tokens from it (a rolling update)
        await self._add({"fence": b"1", "ids": b""}, deadline)  # id <epoch>-0
        if self._epoch == 1 or self.broken:
            self._missing = list(answered or [])
            return False
        before = await self._read(lambda: self.redis.xrange(self.stream, max=f"({self._epoch}-0"), deadline)
        if before is None:
            return False
        held = [t for _, fields in before for t in _ids(fields)]
        answered = answered or []
        if held[: len(answered)] != answered[: len(held)]:
            log.warning("token stream %s: the lost decode's tokens differ from the answer sent", self.stream)
        self._skip = self.overlap = max(0, len(held) - len(answered))
        self._missing = answered[len(held) :]  # a lost decode's writes dropped (its Redis away)
        self.takeover = "overlap" if self._skip else "filled" if self._missing else "continued"
        return any(b"fence" not in fields for _, fields in before)

    async def _read(self, call, deadline: float):
        """A read, retried on slow answers until `deadline`; None (the stream broken) after."""
        while True:
            try:
                return await call()
            except UNAVAILABLE:
                if time.monotonic() > deadline:
                    self.broken = True
                    return None
                await asyncio.sleep(RETRY_PAUSE_S)

    async def add(self, token_ids) -> None:
        token_ids = list(token_ids)
        if self._skip:  # held already, from a lost decode (take_over)
            skipped = min(self._skip, len(token_ids))
            token_ids, self._skip = token_ids[skipped:], self._skip - skipped
        if self._missing:  # after the media rows, ahead of this decode's tokens
            token_ids, self._missing = self._missing + token_ids, []
        if token_ids:
            await self._add({"ids": _bytes(token_ids)})

    async def add_media_rows(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype="<f4")
        await self._add({"media": rows.tobytes(), "width": str(rows.shape[1])})

    async def fail(self, reason: str) -> None:
        await self._add({"error": reason.encode()})

    async def _add(self, fields: dict, deadline: float | None = None) -> None:
        # Entries carry their own ids (<epoch>-1, <epoch>-2, ...): a write retried after a slow answer
        # that did land is refused as a duplicate id, never read twice; a first attempt refused was
        # fenced off by a later decode's epoch (take_over).
        if self.broken:
            return
        self._seq += 1
        deadline, retried = deadline or time.monotonic() + WRITE_DEADLINE_S, False
        while True:
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.xadd(self.stream, fields, id=f"{self._epoch}-{self._seq}")
                    pipe.expire(self.stream, self.ttl_s)
                    await pipe.execute()
                return
            except redis.ResponseError as e:
                if "equal or smaller" not in str(e):
                    raise
                if not retried:
                    self.broken = self.fenced = True
                    log.info(
                        "token stream %s: taken over by a resumed decode; this one's writes stop", self.stream
                    )
                return  # else an earlier attempt landed
            except UNAVAILABLE as e:
                if time.monotonic() > deadline:
                    self.broken = True
                    log.warning("token stream %s: Redis unavailable for %.0f s (%s); speech stops here",
                                self.stream, WRITE_DEADLINE_S, type(e).__name__)  # fmt: skip
                    return
                retried = True
                await asyncio.sleep(RETRY_PAUSE_S)  # a refused connection answers at once

    async def end(self) -> None:
        if self._missing:
            await self.add([])
        await self._add({"end": b"1"})


class ThinkerFailed(RuntimeError):
    """Decode wrote an error entry: the talker cannot go on (e.g. its media rows are missing)."""


async def read(stream: str, wait_s: float, client=None) -> AsyncIterator[list[int] | np.ndarray]:
    """What `stream` carries until its end entry: the media rows ([rows, hidden] float32) if any,
    then token ids chunk by chunk. Raises TimeoutError when nothing is written for `wait_s` (a
    thinker that stalled or died), ThinkerFailed on an error entry."""
    client = client or async_client()
    last, deadline = "0-0", time.monotonic() + wait_s
    while True:
        try:
            entries = await client.xread({stream: last}, count=64, block=BLOCK_MS)
        except UNAVAILABLE:  # a slow answer (a loaded node) is retried until the deadline
            entries = None
        if not entries:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no thinker tokens on {stream} for {wait_s} s")
            continue
        deadline = time.monotonic() + wait_s
        for entry_id, fields in entries[0][1]:
            last = entry_id
            if b"end" in fields:
                return
            if b"error" in fields:
                raise ThinkerFailed(fields[b"error"].decode(errors="replace"))
            if b"media" in fields:
                yield np.frombuffer(fields[b"media"], dtype="<f4").reshape(-1, int(fields[b"width"]))
            elif ids := _ids(fields):  # none: a decode's fence
                yield ids


def _bytes(token_ids) -> bytes:
    return np.asarray(token_ids, dtype="<i4").tobytes()


def _ids(fields: dict) -> list[int]:
    return np.frombuffer(fields.get(b"ids", b""), dtype="<i4").tolist()
