"""Structured output (OpenAI's `response_format`): a JSON schema is compiled here, with the backend
vLLM's engines use (xgrammar), before a request goes anywhere — a schema it cannot compile is the
client's 400 with the reason, not an engine failure mid-request."""

from __future__ import annotations

import re

from services.common.errors import bad_request

PARAM = "response_format.json_schema.schema"
# xgrammar's messages start with the time and the C++ source position: not the client's business.
_SOURCE = re.compile(r"^.*?\.cc:\d+: (Check failed: \(.*?\) is false: )?")
MAX_REASON_CHARS = 300


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
