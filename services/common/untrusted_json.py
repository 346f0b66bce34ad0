"""JSON from clients, parsed with limits: nesting depth, integer size, finite numbers, and text that
is valid Unicode (no lone surrogates, which `\\ud800` escapes produce and protobuf cannot encode).

Python's parser alone would accept `1e999` as infinity, `NaN`, a 100,000-digit integer (then fail
later with a ValueError) and 100,000 nested lists (a RecursionError): each would surface as a 500 or
a stage failure far from the input. Here each is a `JsonLimitError` naming what is wrong.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32
# int64 has at most 19 digits; one more for the sign.
MAX_INT_CHARS = 20


class JsonLimitError(ValueError):
    def __init__(self, message: str, code: str = "invalid_json"):
        super().__init__(message)
        self.message, self.code = message, code


def _int(text: str) -> int:
    if len(text) > MAX_INT_CHARS:
        raise JsonLimitError(f"integer with {len(text)} digits; at most 19 are accepted")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonLimitError(f"number {text[:32]} is out of range")
    return value


def _constant(name: str):
    raise JsonLimitError(f"{name} is not a JSON number")


def loads(raw: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    try:
        # UTF-8 only (RFC 8259 §8.1): json.loads would also guess UTF-16 and UTF-32 from bytes.
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
        data = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except JsonLimitError:
        raise
    except RecursionError:
        raise JsonLimitError(f"JSON nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        # The position only: the message never echoes the client's bytes back.
        raise JsonLimitError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise JsonLimitError("not valid UTF-8") from None
    _check(data, max_depth)
    return data


def _check(data: Any, max_depth: int) -> None:
    """Depth and Unicode of every container, key and string, without recursion."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _unicode(node)
        elif isinstance(node, dict | list):
            if depth > max_depth:
                raise JsonLimitError(f"JSON nested deeper than {max_depth} levels")
            if isinstance(node, dict):
                for key in node:
                    _unicode(key)
                node = node.values()
            stack.extend((child, depth + 1) for child in node)


def _unicode(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise JsonLimitError("string holds a lone UTF-16 surrogate", code="invalid_unicode") from None
