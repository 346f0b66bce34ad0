"""tool_choice "auto": the model decides whether to call, writing its calls in its own format
(Qwen's `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, Llama's JSON, ...). vLLM's tool
parser for that format — the profile's `pipeline.tool_call_parser`, the name vLLM's
`--tool-call-parser` takes (services/extensions/vllm/tool_parsers.py) — splits the streamed answer
into content and call pieces.

The parser sees text, not token ids: decode skips special tokens, so a parser whose markers are
special tokens of the model's tokenizer would never see them; such a profile fails at start.
"""

from __future__ import annotations

from services.extensions.vllm.tool_parsers import VllmToolParsers
from services.pipeline.tools import CallDelta, Tools, new_call_id


class ToolCallParser:
    """The profile's parser, loaded once at start."""

    def __init__(self, name: str, tokenizer, model: str):
        self._parsers = VllmToolParsers(name, tokenizer, model)
        # The token a call's marker is (Qwen's `<tool_call>`), where it is one: a token talker
        # stops before it, so a spoken answer says its lead-in whole (none: speech is cut at the call).
        self.call_start_ids = self._parsers.call_start_ids

    def stream(self, tools: Tools) -> ParsedCalls:
        return ParsedCalls(*self._parsers.for_tools([t.openai() for t in tools.specs], tools.parallel))


class ParsedCalls:
    """One answer through the parser (a `CallStream`): content and call pieces as they are written
    (the parser holds back text that may begin a call's marker); at the end the whole answer is
    parsed once more, and what the stream missed — held-back content, a call's last arguments —
    goes out. An answer whose call does not parse stays content, as vLLM's server has it."""

    def __init__(self, new_parser, request):
        self._new, self._request = new_parser, request
        self._parser = new_parser()
        self._text = ""
        self._content = ""  # content sent
        self._args: dict[int, str] = {}  # arguments sent, per call index
        self.made = False

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        if not text:
            return "", []
        previous, self._text = self._text, self._text + text
        delta = self._parser.extract_tool_calls_streaming(
            previous, self._text, text, [], [], [], self._request
        )
        if delta is None:
            return "", []
        # nothing follows a call in one answer: text after one is not content
        content = "" if self.made else (delta.content or "")
        deltas = []
        for d in delta.tool_calls or ():
            fn = d.function or {}
            fn = fn if isinstance(fn, dict) else fn.model_dump(exclude_none=True)
            args = fn.get("arguments") or ""
            if d.index not in self._args:
                self._args[d.index] = ""
                self.made = True
            self._args[d.index] += args
            deltas.append(CallDelta(d.index, args, d.id or "", fn.get("name") or ""))
        self._content += content
        return content, deltas

    def finish(self) -> tuple[str, list[CallDelta]]:
        whole = self._new().extract_tool_calls(self._text, self._request)
        if not whole.tools_called:
            # nothing parsed: the rest is content (a malformed call stays text), unless the stream
            # already sent calls, which stand
            if self.made or not self._text.startswith(self._content):
                return "", []
            rest, self._content = self._text[len(self._content) :], self._text
            return rest, []
        content = whole.content or ""
        rest = content[len(self._content) :] if content.startswith(self._content) else ""
        deltas = []
        for i, call in enumerate(whole.tool_calls):
            args = call.function.arguments or ""
            if i not in self._args:
                deltas.append(CallDelta(i, args, call.id or new_call_id(), call.function.name))
            elif args.startswith(self._args[i]) and len(args) > len(self._args[i]):
                deltas.append(CallDelta(i, args[len(self._args[i]) :]))
        self.made = True
        return rest, deltas
