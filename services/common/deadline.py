"""An await bounded by a deadline of its own. `asyncio.timeout` alone cannot tell its own expiry from
a TimeoutError the awaited call raised (a client's socket timeout, a nested deadline): callers that
answer the two differently — a stage past its deadline is given up, a call's own error is its own —
would each write the same `expired()` check. And not `asyncio.wait_for`: Python 3.11's can swallow a
cancellation that arrives as the awaited call completes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Overdue(Exception):
    """The deadline of `within` passed; what it awaited was cancelled."""

    def __init__(self, after_s: float):
        super().__init__(f"nothing within {after_s:g} s")
        self.after_s = after_s


async def within(after_s: float, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s result, or Overdue once `after_s` has passed. Anything it raises itself —
    TimeoutError included — passes through unchanged."""
    deadline = asyncio.timeout(after_s)
    try:
        async with deadline:
            return await awaitable
    except TimeoutError:
        if not deadline.expired():
            raise
    raise Overdue(after_s)
