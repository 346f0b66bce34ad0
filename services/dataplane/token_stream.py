"""A response's thinker tokens, from the decode stage straight to the talker stage (a token talker,
Qwen3-Omni's, reads them as they are written): a Redis stream per response, so whichever replicas
serve the two calls find each other, and nothing passes through the gateway.

Decode appends, first, the thinker's hidden states at the prompt's media placeholders when the prompt
has media (the talker's input, services/extensions/vllm/media_rows.py), then each chunk's token ids,
and when the response ends an end entry (or an error entry); the talker reads from the start with
bounded blocking reads. A decode lost mid-response (its replica killed, or its request given up by
its engine) writes no end: the decode that resumes it (services/pipeline/pipeline.py `_decode`)
appends to the same stream after what is there (`TokenStreamWriter.continued`). The stream expires a
while after its last write (the decode stage keeps it as long as a resume may take on top:
`PipelineSpec.thinker_gap_s`), so an abandoned one does not stay.

The stream is speech's side channel: a slow Redis answer (a loaded node) is retried for a few
seconds, and a Redis that stays away breaks the stream, not the response — decode's text goes on,
the talker's read times out and the speech fails alone.
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
log = logging.getLogger(__name__)


def key(request_id: str) -> str:
    return PREFIX + request_id


class TokenStreamWriter:
    def __init__(self, stream: str, client=None, ttl_s: float = TTL_S):
        self.stream, self.ttl_s = stream, int(ttl_s)
        self.redis = client or async_client()
        self._seq = 0
        self.broken = False  # a write failed for good: the rest are dropped (the talker times out)

    async def continued(self) -> bool:
        """Write after what the stream holds (a decode resumed after a lost one wrote part of it);
        whether it holds anything (then the talker has the media rows). A Redis that stays away
        breaks the stream, as a write would."""
        deadline = time.monotonic() + WRITE_DEADLINE_S
        while True:
            try:
                top = await self.redis.xrevrange(self.stream, count=1)
                break
            except UNAVAILABLE:
                if time.monotonic() > deadline:
                    self.broken = True
                    return False
                await asyncio.sleep(RETRY_PAUSE_S)
        if top:
            self._seq = int(top[0][0].split(b"-")[0])
        return bool(top)

    async def add(self, token_ids) -> None:
        await self._add({"ids": np.asarray(token_ids, dtype="<i4").tobytes()})

    async def add_media_rows(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype="<f4")
        await self._add({"media": rows.tobytes(), "width": str(rows.shape[1])})

    async def fail(self, reason: str) -> None:
        await self._add({"error": reason.encode()})

    async def _add(self, fields: dict) -> None:
        # Entries carry their own ids (1-0, 2-0, ...): a write retried after a slow answer that did
        # land is refused as a duplicate id, never read twice.
        if self.broken:
            return
        self._seq += 1
        deadline, retried = time.monotonic() + WRITE_DEADLINE_S, False
        while True:
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.xadd(self.stream, fields, id=f"{self._seq}-0")
                    pipe.expire(self.stream, self.ttl_s)
                    await pipe.execute()
                return
            except redis.ResponseError as e:
                if "equal or smaller" not in str(e) or not retried:
                    raise
                return  # an earlier attempt landed
            except UNAVAILABLE as e:
                if time.monotonic() > deadline:
                    self.broken = True
                    log.warning("token stream %s: Redis unavailable for %.0f s (%s); speech stops here",
                                self.stream, WRITE_DEADLINE_S, type(e).__name__)  # fmt: skip
                    return
                retried = True
                await asyncio.sleep(RETRY_PAUSE_S)  # a refused connection answers at once

    async def end(self) -> None:
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
            else:
                yield np.frombuffer(fields[b"ids"], dtype="<i4").tolist()
