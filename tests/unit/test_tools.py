"""Function calling's pure parts: the schema a forced call is generated under compiles with the
engines' grammar backend and admits exactly the calls it should; the model's JSON becomes calls; the
tools and calls are written as text for templates without a place for them."""

from __future__ import annotations

import json

import pytest
import xgrammar
from hypothesis import given
from hypothesis import strategies as st

from services.common.errors import OmniError
from services.models.profile import load_profile
from services.pipeline.prompt import PromptBuilder
from services.pipeline.tools import ContentOrCalls, NamedCall, RequiredCalls, Tool, ToolCall, Tools, joined
from services.pipeline.turn import Message

WEATHER = Tool(
    "get_weather",
    "The weather in a city",
    json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
TIME = Tool("get_time", "The time now")


def _accepts(schema: str, text: str) -> bool:
    """Whether the grammar of `schema` accepts `text` whole (xgrammar's matcher, byte by byte), with
    the engine's settings: no free whitespace, json.dumps' separators (", " and ": ")."""
    info = xgrammar.TokenizerInfo([])
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(schema, any_whitespace=False)
    matcher = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def test_a_named_function_is_generated_under_its_parameters():
    tools = Tools((WEATHER, TIME), "function", "get_weather")
    assert _accepts(tools.schema(), '{"city": "Paris"}')
    assert not _accepts(tools.schema(), '{"town": "Paris"}')
    stream = NamedCall("get_weather")
    pieces = [stream.feed(t) for t in ('{"city"', ':"Paris"}')] + [stream.finish()]
    assert all(content == "" for content, _ in pieces) and stream.made
    (call,) = joined([d for _, deltas in pieces for d in deltas])
    assert (call.name, call.arguments) == ("get_weather", '{"city":"Paris"}') and call.id.startswith("call_")


def test_required_admits_one_call_of_any_tool_or_several_in_parallel():
    single = Tools((WEATHER, TIME), "required", parallel=False)
    assert _accepts(single.schema(), '{"name": "get_time", "arguments": {}}')
    assert not _accepts(single.schema(), '{"name": "get_date", "arguments": {}}')
    assert not _accepts(single.schema(), '{"name": "get_weather", "arguments": {}}')  # city is required
    parallel = Tools((WEATHER, TIME), "required")
    text = json.dumps(
        [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]
    )
    assert _accepts(parallel.schema(), text) and not _accepts(parallel.schema(), "[]")
    stream = RequiredCalls(parallel)
    assert stream.feed(text[:9]) == ("", []) and stream.feed(text[9:]) == ("", [])
    content, deltas = stream.finish()
    calls = joined(deltas)
    assert content == "" and stream.made
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in calls}) == 2


@given(st.text(max_size=40))
def test_any_text_becomes_calls_without_raising(text):
    for stream in (RequiredCalls(Tools((WEATHER,), "required")), NamedCall("get_weather")):
        stream.feed(text)
        _, deltas = stream.finish()
        assert all(isinstance(c, ToolCall) for c in joined(deltas)) and stream.made


def test_auto_as_structured_output_admits_content_or_calls_and_nothing_else():
    schema = Tools((WEATHER, TIME), "auto").content_or_calls_schema()
    assert _accepts(schema, '{"content": "It is sunny."}')
    assert _accepts(schema, '{"tool_calls": [{"name": "get_time", "arguments": {}}]}')
    assert not _accepts(schema, '{"tool_calls": []}')
    assert not _accepts(schema, '{"content": "x", "tool_calls": [{"name": "get_time", "arguments": {}}]}')
    assert not _accepts(schema, "It is sunny.")
    single = Tools((WEATHER, TIME), "auto", parallel=False).content_or_calls_schema()
    two = [{"name": "get_time", "arguments": {}}] * 2
    assert _accepts(schema, json.dumps({"tool_calls": two})) and not _accepts(
        single, json.dumps({"tool_calls": two})
    )


def _fed(stream: ContentOrCalls, answer: str, cuts: list[int]) -> tuple[str, list]:
    """The answer fed in pieces cut at `cuts`: the content streamed and the calls, with the finish."""
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(answer)), len(answer)]
    pieces = [stream.feed(answer[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)] + [stream.finish()]
    return "".join(content for content, _ in pieces), [d for _, deltas in pieces for d in deltas]


@given(st.text(max_size=60), st.booleans(), st.lists(st.integers(0, 200), max_size=12))
def test_auto_content_streams_as_written_cut_anywhere(text, ascii_only, cuts):
    """Any reply, escaped or not, fed in any pieces: the content sent equals the reply (lone
    surrogates, which UTF-8 cannot carry, as U+FFFD) and no calls."""
    answer = json.dumps({"content": text}, ensure_ascii=ascii_only)
    stream = ContentOrCalls(Tools((WEATHER,), "auto"))
    content, deltas = _fed(stream, answer, cuts)
    assert content == "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    assert deltas == [] and not stream.made


def test_auto_content_goes_out_before_the_answer_ends_and_calls_once_complete():
    stream = ContentOrCalls(Tools((WEATHER,), "auto"))
    assert stream.feed('{"content": "Sun') == ("Sun", [])
    assert stream.feed("ny \\u00e") == ("ny ", [])  # an escape is held until whole
    assert stream.feed("9.") == ("\u00e9.", [])
    calls = ContentOrCalls(Tools((WEATHER, TIME), "auto"))
    answer = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]})
    content, deltas = _fed(calls, answer, [5, 20])
    (call,) = joined(deltas)
    assert (
        content == ""
        and calls.made
        and (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})
    )


def test_an_auto_answer_cut_by_max_tokens_keeps_what_was_written():
    stream = ContentOrCalls(Tools((WEATHER,), "auto"))
    assert _fed(stream, '{"content": "It is sun', [3]) == ("It is sun", [])
    stream = ContentOrCalls(Tools((WEATHER,), "auto"))
    content, deltas = _fed(stream, '{"tool_calls": [{"name": "get_wea', [])
    assert content == "" and stream.made and joined(deltas)[0].arguments.startswith("{")
    assert _fed(ContentOrCalls(Tools((WEATHER,), "auto")), '{"cont', []) == ("", [])


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        (Tools((WEATHER, WEATHER), "required"), "tools"),
        (Tools((WEATHER,), "function", "nope"), "tool_choice"),
        (Tools((), "required"), "tool_choice"),
    ],
)
def test_inconsistent_tools_are_a_400(tools, param):
    with pytest.raises(OmniError) as e:
        tools.check()
    assert e.value.status == 400 and e.value.param == param


def test_templates_without_tools_get_them_as_text():
    profile = load_profile("tiny")
    builder = PromptBuilder(str(profile.model_path(profile.models.thinker)))
    assert not builder.native_tools
    call = ToolCall("call_1", "get_weather", '{"city":"Paris"}')
    messages = [
        Message("user", ("Weather in Paris?",)),
        Message("assistant", (), tool_calls=(call,)),
        Message("tool", ('{"sky":"clear"}',), tool_call_id="call_1"),
    ]
    text = "".join(builder.layout(messages, (WEATHER,)).pieces)
    assert '"name": "get_weather", "description": "The weather in a city"' in text  # the offered tool
    assert '[{"name": "get_weather", "arguments": {"city": "Paris"}}]' in text  # the call made
    assert '<|im_start|>tool\n{"sky":"clear"}' in text  # its result
    assert '{"content": ' not in text
    decided = "".join(builder.layout(messages, (WEATHER,), content_or_calls=True).pieces)
    assert 'Answer in JSON: {"content": ' in decided  # the shape of an "auto" answer


async def test_schemas_compile_off_the_loop_once_and_within_a_deadline(monkeypatch):
    from services.pipeline import structured_output as so

    calls = []
    monkeypatch.setattr(so, "_compiled", so.OrderedDict())
    real = so.check_json_schema
    monkeypatch.setattr(
        so, "check_json_schema", lambda schema, **kw: (calls.append(schema), real(schema, **kw))
    )
    schema = Tools((WEATHER,), "required").schema()
    await so.checked_json_schema(schema, param="tools", what="tools")
    await so.checked_json_schema(schema, param="tools", what="tools")
    assert calls == [schema]  # remembered
    with pytest.raises(OmniError) as e:
        await so.checked_json_schema('{"type": "nope"}', param="tools", what="tools")
    assert e.value.param == "tools" and "does not compile" in e.value.message

    import time

    monkeypatch.setattr(so, "COMPILE_DEADLINE_S", 0.05)
    monkeypatch.setattr(so, "check_json_schema", lambda schema, **kw: time.sleep(0.5))
    with pytest.raises(OmniError) as e:
        await so.checked_json_schema('{"type": "object"}')
    assert e.value.status == 400 and "too long" in e.value.message
