"""A response's thinker tokens, from the decode stage straight to the talker stage (a token talker,
Qwen3-Omni's, reads them as they are written): a Redis stream per response, so whichever replicas
serve the two calls find each other, and nothing passes through the gateway.

Decode appends each chunk's token ids and, when the response ends for any reason, an end entry;
the talker reads from the start with bounded blocking reads. The stream expires a while after its
last write, so an abandoned one (a stage killed mid-response) does not stay.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import numpy as np

from services.common.redis_config import async_client

PREFIX = "omniray:tokens:"
TTL_S = 120
# One blocking read: below the client's socket timeout (a longer block would read as a stalled Redis).
BLOCK_MS = 200


def key(request_id: str) -> str:
    return PREFIX + request_id


class TokenStreamWriter:
    def __init__(self, stream: str, redis=None):
        self.stream = stream
        self.redis = redis or async_client()

    async def add(self, token_ids) -> None:
        ids = np.asarray(token_ids, dtype="<i4").tobytes()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self.stream, {"ids": ids})
            pipe.expire(self.stream, TTL_S)
            await pipe.execute()

    async def end(self) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self.stream, {"end": b"1"})
            pipe.expire(self.stream, TTL_S)
            await pipe.execute()


async def read(stream: str, wait_s: float, redis=None) -> AsyncIterator[list[int]]:
    """The token ids written to `stream`, chunk by chunk, until its end entry. Raises TimeoutError
    when nothing is written for `wait_s` (a thinker that stalled or died)."""
    redis = redis or async_client()
    last, deadline = "0-0", time.monotonic() + wait_s
    while True:
        entries = await redis.xread({stream: last}, count=64, block=BLOCK_MS)
        if not entries:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no thinker tokens on {stream} for {wait_s} s")
            continue
        deadline = time.monotonic() + wait_s
        for entry_id, fields in entries[0][1]:
            last = entry_id
            if b"end" in fields:
                return
            yield np.frombuffer(fields[b"ids"], dtype="<i4").tolist()
