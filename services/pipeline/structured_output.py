"""Structured output (OpenAI's `response_format`, required tool calls): a JSON schema is compiled
here, with the backend vLLM's engines use (xgrammar), before a request goes anywhere — a schema it
cannot compile is the client's 400 with the reason, not an engine failure mid-request. Compiling runs
off the event loop, bounded in time (a schema built to take long is a 400 too), and schemas that
compiled are remembered (a client sends the same one again and again)."""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict

from services.common.errors import bad_request

PARAM = "response_format.json_schema.schema"
# xgrammar's messages carry the time and the C++ source position (at the start, and again for each
# error it wraps): not the client's business.
_SOURCE = re.compile(r"(\[[\d:]+\] )?\S*\.(cc|h|cpp|hpp):\d+: (Check failed: \(.*?\) is false: )?")
MAX_REASON_CHARS = 300
COMPILE_DEADLINE_S = 5.0
REMEMBERED = 256
_compiled: OrderedDict[str, None] = OrderedDict()  # schemas that compiled, most recent last


def check_json_schema(schema: str, *, param: str = PARAM, what: str = "response_format") -> None:
    import xgrammar

    try:
        xgrammar.Grammar.from_json_schema(schema)
    except (RuntimeError, ValueError) as e:
        reason = _SOURCE.sub("", str(e).strip().splitlines()[0] if str(e).strip() else "")
        raise bad_request(
            f"{what}: the JSON schema does not compile: {reason[:MAX_REASON_CHARS] or 'invalid'}",
            code="invalid_json_schema",
            param=param,
        ) from None


async def checked_json_schema(schema: str, *, param: str = PARAM, what: str = "response_format") -> None:
    """check_json_schema off the event loop, within COMPILE_DEADLINE_S."""
    if schema in _compiled:
        _compiled.move_to_end(schema)
        return
    try:
        await asyncio.wait_for(
            asyncio.to_thread(check_json_schema, schema, param=param, what=what), COMPILE_DEADLINE_S
        )
    except TimeoutError:
        raise bad_request(
            f"{what}: the JSON schema takes too long to compile (over {COMPILE_DEADLINE_S:g} s)",
            code="invalid_json_schema",
            param=param,
        ) from None
    _compiled[schema] = None
    if len(_compiled) > REMEMBERED:
        _compiled.popitem(last=False)
