"""Function calling. A call the request requires (`tool_choice` "required" or a named function)
works on any model: it is generated under a JSON schema built from the tools' parameters (vLLM's
structured outputs, as `response_format` is), and the JSON the model writes is the calls:

- a named function: the output is that function's arguments (its `parameters` schema);
- "required": the output is `{"name": ..., "arguments": {...}}` (one of the tools), or with
  parallel calls a non-empty array of those.

With "auto" the model decides, writing its calls in its own format; vLLM's tool parser for that
format finds them (services/pipeline/tool_parser.py). Either way the answer's text goes through a
`CallStream`, which splits it into content and `CallDelta`s as decode writes it; docs/api.md "Tools".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Literal, Protocol

from services.common.errors import bad_request

MAX_TOOLS = 128  # OpenAI's
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: str = ""  # a JSON schema as JSON text; "" for none (any object)

    def parameters_schema(self) -> dict:
        return json.loads(self.parameters) if self.parameters else ANY_OBJECT

    def openai(self) -> dict:
        """As chat templates take tools (OpenAI's shape)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters_schema(),
            },
        }


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI's `function.arguments`


@dataclass(frozen=True)
class Tools:
    """What a request offers and asks: `choice` none | auto | required | function (`name`)."""

    specs: tuple[Tool, ...]
    choice: Literal["none", "auto", "required", "function"] = "auto"
    name: str = ""  # choice "function": the function
    parallel: bool = True

    @property
    def forced(self) -> bool:
        """The answer is tool calls, whatever the model would say."""
        return self.choice in ("required", "function")

    def check(self) -> None:
        names = [t.name for t in self.specs]
        if len(set(names)) != len(names):
            raise bad_request("tool names must be unique", param="tools")
        if self.choice == "function" and self.name not in names:
            raise bad_request(
                f"tool_choice names {self.name[:64]!r}, which is not in tools", param="tool_choice"
            )
        if self.choice != "none" and not self.specs:
            raise bad_request("tool_choice needs tools", param="tool_choice")

    def schema(self) -> str:
        """The JSON schema a forced answer is generated under (choice required / function)."""
        if self.choice == "function":
            return json.dumps(next(t for t in self.specs if t.name == self.name).parameters_schema())
        call = self._call_schema()
        return json.dumps({"type": "array", "items": call, "minItems": 1} if self.parallel else call)

    def content_or_calls_schema(self) -> str:
        """ "auto" on a model with no call format of its own: the answer is generated as
        `{"content": "..."}` or `{"tool_calls": [calls]}` (one call without parallel calls), so the
        model still decides, and its decision is always valid (ContentOrCalls reads it)."""
        calls = {"type": "array", "items": self._call_schema(), "minItems": 1}
        if not self.parallel:
            calls["maxItems"] = 1
        return json.dumps({"anyOf": [_only({"content": {"type": "string"}}), _only({"tool_calls": calls})]})

    def _call_schema(self) -> dict:
        return {
            "anyOf": [
                _only({"name": {"const": t.name}, "arguments": t.parameters_schema()}) for t in self.specs
            ]
        }

    def calls(self, text: str) -> list[ToolCall]:
        """A "required" answer's text as its calls (the grammar made it valid JSON of the schema; an
        answer cut by max_tokens is not, and gives its text as one call's arguments)."""
        try:
            found = json.loads(text)
        except ValueError:
            found = None
        found = found if isinstance(found, list) else [found]
        calls = [
            ToolCall(
                new_call_id(), c.get("name", ""), json.dumps(c.get("arguments", {}), separators=(",", ":"))
            )
            for c in found
            if isinstance(c, dict)
        ]
        return calls or [ToolCall(new_call_id(), "", text)]


@dataclass(frozen=True)
class CallDelta:
    """A piece of the answer's tool calls as it is written: a call's first piece carries its id and
    name, later ones add to its arguments (OpenAI's streamed `tool_calls` deltas)."""

    index: int
    arguments: str = ""
    id: str = ""
    name: str = ""


class CallStream(Protocol):
    """One answer's text as decode writes it -> (content, call pieces). `made`: a call was written
    (the answer finishes with "tool_calls")."""

    made: bool

    def feed(self, text: str) -> tuple[str, list[CallDelta]]: ...

    def finish(self) -> tuple[str, list[CallDelta]]:
        """What was held back, once the answer is whole."""
        ...


class NamedCall:
    """A named function's call: the answer is its arguments, streamed as they are written."""

    def __init__(self, name: str):
        self.name, self.made = name, False

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        if self.made:
            return "", [CallDelta(0, text)] if text else []
        self.made = True
        return "", [CallDelta(0, text, new_call_id(), self.name)]

    def finish(self) -> tuple[str, list[CallDelta]]:
        return ("", []) if self.made else self.feed("")


class RequiredCalls:
    """ "required": the calls go out whole once their JSON is complete (a function's name is inside
    it, after its arguments may have begun)."""

    def __init__(self, tools: Tools):
        self.tools, self.made, self._text = tools, False, []

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self._text.append(text)
        return "", []

    def finish(self) -> tuple[str, list[CallDelta]]:
        calls = self.tools.calls("".join(self._text))
        self.made = bool(calls)
        return "", [CallDelta(i, c.arguments, c.id, c.name) for i, c in enumerate(calls)]


# The start of a `content_or_calls_schema` answer, up to its content string's opening quote, or its key
_DECIDED = re.compile(r'\s*\{\s*"(?:(content)"\s*:\s*"|(tool_calls)")')
_ESCAPED = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class ContentOrCalls:
    """ "auto" answered as structured output (Tools.content_or_calls_schema): the content streams
    out as its JSON string is written (an escape held back until it is whole), calls go out whole
    once the JSON is complete. An answer cut by max_tokens: the content written so far, or its
    calls' text as one call's arguments (as RequiredCalls)."""

    def __init__(self, tools: Tools):
        self.tools, self.made = tools, False
        self._text = ""
        self._key = ""  # "content" | "tool_calls", once written
        self._at = 0  # content: where the string's unread part begins in _text
        self._sent = 0  # content: characters sent

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self._text += text
        if not self._key and (m := _DECIDED.match(self._text)):
            self._key, self._at = m.group(1) or m.group(2), m.end()
        return (self._read(), []) if self._key == "content" else ("", [])

    def _read(self) -> str:
        """The content string's characters written since the last read, up to an escape not yet
        whole or the closing quote."""
        s, i, out = self._text, self._at, []
        while i < len(s) and s[i] != '"':
            if s[i] != "\\":
                out.append(s[i])
                i += 1
                continue
            if s[i + 1 : i + 2] != "u":
                if i + 2 > len(s):
                    break
                out.append(_ESCAPED.get(s[i + 1], s[i + 1]))
                i += 2
                continue
            width = 6
            if s[i + 2 : i + 4].lower() in ("d8", "d9", "da", "db"):  # a high surrogate: its pair?
                if i + 8 > len(s):
                    break
                width = 12 if s[i + 6 : i + 8] == "\\u" else 6
            if i + width > len(s):
                break
            try:
                out.append(_unpaired_replaced(json.loads(f'"{s[i : i + width]}"')))
            except ValueError:  # the grammar writes none; a cut answer's last escape at most
                break
            i += width
        self._at = i
        piece = "".join(out)
        self._sent += len(piece)
        return piece

    def finish(self) -> tuple[str, list[CallDelta]]:
        try:
            whole = json.loads(self._text)
        except ValueError:
            whole = None
        if self._key == "content":
            if isinstance(whole, dict) and isinstance(whole.get("content"), str):
                return _unpaired_replaced(whole["content"][self._sent :]), []
            return self._read(), []
        if self._key != "tool_calls":
            return "", []
        found = whole.get("tool_calls") if isinstance(whole, dict) else None
        calls = self.tools.calls(json.dumps(found) if found is not None else self._text)
        self.made = True
        return "", [CallDelta(i, c.arguments, c.id, c.name) for i, c in enumerate(calls)]


def _unpaired_replaced(text: str) -> str:
    """JSON escapes may write a lone surrogate, which UTF-8 cannot carry: U+FFFD in its place."""
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def _only(properties: dict) -> dict:
    """An object of exactly these properties (name -> schema), all required."""
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}  # fmt: skip


def joined(deltas: list[CallDelta]) -> list[ToolCall]:
    """Streamed call pieces as whole calls, in index order."""
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.index not in calls:
            calls[d.index] = [d.id, d.name, ""]
        calls[d.index][2] += d.arguments
    return [ToolCall(*calls[i]) for i in sorted(calls)]


def asked(
    tools: list[tuple[str, str, dict | None]], choice: str | None, function: str = "", parallel: bool = True
) -> Tools | None:
    """What a request offers and asks, from its wire's pieces: (name, description, parameters) of
    each tool, the choice ("none" | "auto" | "required"; None: auto with tools, else none) or the
    function named. None when it offers nothing and asks nothing."""
    if not tools and choice in (None, "auto") and not function:
        return None
    specs = tuple(Tool(n, d, json.dumps(params) if params is not None else "") for n, d, params in tools)
    if function:
        return Tools(specs, "function", function, parallel)
    return Tools(specs, choice or ("auto" if specs else "none"), parallel=parallel)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def described(tools: tuple[Tool, ...], content_or_calls: bool = False) -> str:
    """The tools as text, for chat templates that have no place for them; with `content_or_calls`,
    the shape of an "auto" answer generated as structured output."""
    lines = ["You can call these functions (JSON schemas of their arguments):"]
    for t in tools:
        lines.append(
            json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters_schema()})
        )
    if content_or_calls:
        lines.append('Answer in JSON: {"content": "your reply"} to reply, or '
                     '{"tool_calls": [{"name": "a function", "arguments": {...}}]} to call functions.')  # fmt: skip
    return "\n".join(lines)


def calls_text(calls: tuple[ToolCall, ...]) -> str:
    """An assistant's calls as text, for chat templates that have no place for them."""
    return json.dumps([{"name": c.name, "arguments": arguments_value(c.arguments)} for c in calls])


def arguments_value(arguments: str):
    """Arguments as chat templates take them (a mapping), or the text when it is not JSON."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
