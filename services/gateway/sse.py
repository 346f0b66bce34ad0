"""Server-sent events: a line, and a stream whose failure is reported in-band (its status went out
with its first bytes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from services.common.errors import OmniError, internal_error


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def reported(
    lines: AsyncIterator[str], what: str, failed: Callable[[dict], str] = sse
) -> AsyncIterator[str]:
    """`lines`, then — if they fail — the error body as `failed` renders it (a 4xx/5xx body: no
    exception text; an unexpected failure is logged under an id by internal_error, `what` failed)."""
    try:
        async for line in lines:
            yield line
    except OmniError as e:
        yield failed(e.body())
    except Exception as e:
        yield failed(internal_error(e, what).body())
