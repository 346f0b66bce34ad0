"""Adaptive coalescing of streamed items.

A consumer that is slower than its producer (a network hop per item) gets everything that piled up
since its last read merged into one item, so per-item costs stop scaling with tokens under load
while an idle stream still sends each item at once — the same idea as vLLM's stream interval,
without a fixed delay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


async def next_batch(queue: asyncio.Queue) -> list:
    """Wait for one item, then take everything else already queued."""
    batch = [await queue.get()]
    while not queue.empty():
        batch.append(queue.get_nowait())
    return batch


async def coalesce(source: AsyncIterator[T], merge: Callable[[list[T]], T]) -> AsyncIterator[T]:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in source:
                queue.put_nowait(item)
        except BaseException as e:  # noqa: BLE001 (re-raised in the consumer)
            queue.put_nowait(_Failure(e))
        finally:
            queue.put_nowait(_DONE)

    task = asyncio.create_task(pump())
    try:
        while True:
            batch = await next_batch(queue)
            end = next((i for i, x in enumerate(batch) if x is _DONE or isinstance(x, _Failure)), None)
            items = batch if end is None else batch[:end]
            if items:
                yield merge(items)
            if end is not None:
                if isinstance(batch[end], _Failure):
                    raise batch[end].error
                return
    finally:
        task.cancel()
