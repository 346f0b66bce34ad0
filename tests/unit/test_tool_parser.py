"""tool_choice "auto" through vLLM's tool parser (the qwen3-omni profiles' `hermes`, with
qwen3-omni-tiny's tokenizer): however decode cuts the answer, the content and the calls come out the
same as a whole-answer parse; text that may begin a call is held back, not lost; a call that does not
parse stays content; a marker that is a special token is refused at start, one that is a single
token is where a token talker stops."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.models.profile import load_profile
from services.pipeline.prompt import PromptBuilder
from services.pipeline.tool_parser import ToolCallParser
from services.pipeline.tools import Tool, Tools, joined

WEATHER = Tool(
    "get_weather",
    "The weather in a city",
    json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
TIME = Tool("get_time", "The time now")
TOOLS = Tools((WEATHER, TIME), "auto")

_PARSER: ToolCallParser | None = None


def parser() -> ToolCallParser:
    global _PARSER
    if _PARSER is None:
        profile = load_profile("qwen3-omni-tiny")
        tokenizer = PromptBuilder(str(profile.model_path(profile.models.thinker))).tokenizer
        _PARSER = ToolCallParser(profile.pipeline.tool_call_parser, tokenizer, profile.served_model_name)
    return _PARSER


def streamed(text: str, cuts: list[int]) -> tuple[str, list, bool]:
    """`text` fed in pieces cut at `cuts`, then finished: (content, calls, made)."""
    stream = parser().stream(TOOLS)
    content, deltas = "", []
    bounds = [0, *sorted(set(cuts)), len(text)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        c, d = stream.feed(text[a:b])
        content += c
        deltas += d
    c, d = stream.finish()
    return content + c, joined(deltas + d), stream.made


ONE_CALL = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


def cuts_of(text: str):
    return st.lists(st.integers(min_value=1, max_value=len(text) - 1), max_size=12)


@settings(max_examples=60, deadline=None)
@given(cuts=cuts_of(ONE_CALL))
def test_a_call_after_content_comes_out_the_same_however_it_is_cut(cuts):
    content, calls, made = streamed(ONE_CALL, cuts)
    assert content == "Let me check. " and made
    (call,) = calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"} and call.id


@settings(max_examples=40, deadline=None)
@given(cuts=cuts_of(TWO_CALLS))
def test_parallel_calls_keep_their_order_and_ids(cuts):
    content, calls, made = streamed(TWO_CALLS, cuts)
    assert content == "" and made
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in calls}) == 2


@settings(max_examples=40, deadline=None)
@given(
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60),
    cuts=st.lists(st.integers(1, 59)),
)
def test_an_answer_without_calls_is_all_content(text, cuts):
    text = text.replace("<tool_call>", "")
    content, calls, made = streamed(text, [c for c in cuts if c < len(text)])
    assert (content, calls, made) == (text, [], False)


def test_text_that_may_begin_a_call_is_held_back_then_flushed():
    stream = parser().stream(TOOLS)
    assert stream.feed("The answer is 4 <tool")[0] == "The answer is 4 "
    assert stream.finish() == ("<tool", [])


def test_a_call_that_does_not_parse_stays_content():
    text = "Sure <tool_call>\nnot json at all\n</tool_call>"
    content, calls, made = streamed(text, [7, 20])
    assert (content, calls, made) == (text, [], False)


def test_a_call_cut_by_max_tokens_keeps_what_was_streamed():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    content, calls, made = streamed(text, [30, 50])
    (call,) = calls
    assert (
        content == "" and made and call.name == "get_weather" and call.arguments.startswith('{"city": "Par')
    )


def test_nothing_after_a_call_is_content():
    content, calls, _ = streamed(ONE_CALL + " And more words.", [20, 95])
    assert content == "Let me check. " and len(calls) == 1


def test_unknown_parsers_and_special_token_markers_fail_at_start():
    profile = load_profile("qwen3-omni-tiny")
    tokenizer = PromptBuilder(str(profile.model_path(profile.models.thinker))).tokenizer
    with pytest.raises(ValueError, match="not one of vLLM's tool parsers"):
        ToolCallParser("no-such-parser", tokenizer, "m")
    special = copy.deepcopy(tokenizer)
    special.add_special_tokens({"additional_special_tokens": ["<tool_call>"]})
    with pytest.raises(ValueError, match="special token"):
        ToolCallParser("hermes", special, "m")


def test_a_one_token_marker_is_where_a_token_talker_stops():
    """Qwen's `<tool_call>` is one token of its vocabulary: the token a spoken answer's talker stops
    at. A parser whose marker is several tokens (or none) gives none: speech is cut at the call."""
    tokenizer = parser()._parsers._tokenizer
    assert parser().call_start_ids == (151657,)  # Qwen's ids; added tokens decode writes
    assert tokenizer.decode([151657, 151658], skip_special_tokens=True) == "<tool_call></tool_call>"
    assert ToolCallParser("llama3_json", tokenizer, "m").call_start_ids == ()
