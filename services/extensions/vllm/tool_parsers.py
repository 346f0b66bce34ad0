"""vLLM's tool parsers (`--tool-call-parser`), for the pipeline's tool_choice "auto"
(services/pipeline/tool_parser.py): the parser class a profile names, and the request it reads the
offered tools from. Importing vLLM's parsers takes seconds: only profiles that name one pay it, at
start."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class VllmToolParsers:
    def __init__(self, name: str, tokenizer, model: str):
        from vllm.tool_parsers import ToolParserManager

        try:
            self._cls = ToolParserManager.get_tool_parser(name)
        except KeyError:
            raise ValueError(
                f"pipeline.tool_call_parser {name!r} is not one of vLLM's tool parsers"
            ) from None
        # Decode skips special tokens: a parser whose marker is one would never see it.
        marker = getattr(self._cls, "tool_call_start_token", None)
        if marker and marker in set(tokenizer.all_special_tokens):
            raise ValueError(
                f"tool parser {name!r} looks for {marker!r}, a special token decode does not write"
            )
        self._tokenizer, self._model = tokenizer, model
        # A marker that is one token of the vocabulary: the token a call begins with (a token
        # talker stops before it); none for a parser without one or a marker of several tokens.
        ids = tokenizer.encode(marker, add_special_tokens=False) if marker else []
        self.call_start_ids: tuple[int, ...] = tuple(ids) if len(ids) == 1 else ()

    def for_tools(self, tools: list[dict], parallel: bool) -> tuple[Callable[[], Any], Any]:
        """(a new parser for one answer, the request it is given) for the offered tools (OpenAI's
        shape)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        request = ChatCompletionRequest(
            model=self._model, messages=[], tools=tools, tool_choice="auto", parallel_tool_calls=parallel
        )
        return lambda: self._cls(self._tokenizer, request.tools), request
