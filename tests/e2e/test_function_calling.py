"""Function calling with the official SDK on the tiny deployment (random weights: only the grammar
makes its calls valid): a named function's arguments follow its parameters, streamed as tool_calls
deltas; "required" calls one of the tools (in parallel or not); a call's result goes back as a tool
message and the model answers from it; a forced call asked for with audio out is not spoken;
"auto" (the default with tools), which tiny's model has no call format for, is answered as
structured output: content or schema-valid calls, turn after turn of an agent loop."""

from __future__ import annotations

import json

import openai
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            # enums only: random weights under the grammar would write an unbounded number's digits
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "What's the weather in Paris, in Celsius?"}]


def _create(client, model, **kw):
    return client.chat.completions.create(model=model, messages=kw.pop("messages", ASK),
                                          max_tokens=kw.pop("max_tokens", 64), temperature=0, **kw)  # fmt: skip


def test_a_named_function_is_called_with_arguments_that_follow_its_parameters(openai_client, model_name):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = _create(openai_client, model_name, tools=[WEATHER, TIME], tool_choice=choice)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert args["city"] in ("Paris", "Oslo") and args["unit"] in ("C", "F") and set(args) == {"city", "unit"}


def test_a_named_call_streams_as_tool_call_deltas(openai_client, model_name):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    stream = _create(openai_client, model_name, tools=[WEATHER], tool_choice=choice, stream=True)
    deltas, finish = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.tool_calls:
            deltas += chunk.choices[0].delta.tool_calls
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and len(deltas) >= 2  # the arguments arrive in pieces
    assert deltas[0].id and deltas[0].function.name == "get_weather" and all(d.index == 0 for d in deltas)
    assert json.loads("".join(d.function.arguments or "" for d in deltas))["city"] in ("Paris", "Oslo")


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_one_of_the_tools(openai_client, model_name, parallel):
    r = _create(
        openai_client, model_name, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls and (parallel or len(calls) == 1)
    for call in calls:
        assert call.function.name in ("get_weather", "get_time")
        assert isinstance(json.loads(call.function.arguments), dict)
    stream = _create(openai_client, model_name, tools=[WEATHER, TIME], tool_choice="required", stream=True,
                     parallel_tool_calls=parallel)  # fmt: skip
    streamed = [
        d
        for ch in stream
        if ch.choices and ch.choices[0].delta.tool_calls
        for d in ch.choices[0].delta.tool_calls
    ]
    assert streamed and all(d.function.name in ("get_weather", "get_time") for d in streamed)


def test_a_tool_round_trip(openai_client, model_name):
    """call -> the caller runs it -> its result as a tool message -> the model answers in text."""
    r = _create(openai_client, model_name, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    call = r.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "clear", "high_c": 21})},
    ]
    answer = _create(
        openai_client, model_name, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8
    )
    c = answer.choices[0]
    assert c.message.tool_calls is None and c.message.content and c.finish_reason == "length"
    before = _create(openai_client, model_name, tools=[WEATHER], tool_choice="none", max_tokens=1)
    assert (
        answer.usage.prompt_tokens > before.usage.prompt_tokens + 10
    )  # the call and its result are in the prompt


def test_a_forced_call_with_audio_out_is_not_spoken(openai_client, model_name):
    r = _create(openai_client, model_name, tools=[WEATHER], tool_choice="required",
                modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})  # fmt: skip
    m = r.choices[0].message
    assert m.tool_calls and m.audio is None


def _valid_auto_answer(choice) -> None:
    """An "auto" answer is either content or calls of the offered tools that follow their parameters."""
    m = choice.message
    if m.tool_calls:
        assert choice.finish_reason == "tool_calls" and m.content is None
        for call in m.tool_calls:
            assert call.function.name in ("get_weather", "get_time") and call.id.startswith("call_")
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert choice.finish_reason in ("stop", "length") and isinstance(m.content, str)


def test_an_agent_loop_with_tool_choice_auto_runs_turn_after_turn(openai_client, model_name):
    """Frameworks send the same tools on every turn with the default tool_choice: each turn answers
    (content or calls), the calls' results go back, and the next turn answers again."""
    tools = [WEATHER, TIME]
    messages = list(ASK)
    for turn in range(3):
        r = _create(openai_client, model_name, messages=messages, tools=tools, max_tokens=48, seed=turn)
        (choice,) = r.choices
        _valid_auto_answer(choice)
        if choice.message.tool_calls:
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [c.model_dump() for c in choice.message.tool_calls]})  # fmt: skip
            messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"sky": "clear"}'}
                         for c in choice.message.tool_calls]  # fmt: skip
        else:
            messages += [{"role": "assistant", "content": choice.message.content},
                         {"role": "user", "content": "And the time?"}]  # fmt: skip
    streamed = openai_client.chat.completions.create(
        model=model_name, messages=messages, tools=tools, max_tokens=48, temperature=0, stream=True
    )
    chunks = list(streamed)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert finish in (["tool_calls"], ["stop"], ["length"]) and (
        calls if finish == ["tool_calls"] else not calls
    )
    assert not content.startswith('{"content"')  # the reply's text, not its JSON


def test_auto_with_response_format_is_refused_with_the_reason(openai_client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        _create(openai_client, model_name, tools=[WEATHER], response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format" and "structured output" in e.value.message


def test_grpc_chat_calls_a_required_tool(omniray, model_name):
    from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc

    from tests.conftest import grpc_channel

    channel = grpc_channel(omniray.grpc_target)
    try:
        stub = omni_pb2_grpc.OmniStub(channel)
        tool = omni_pb2.FunctionTool(
            name="get_weather", parameters_json=json.dumps(WEATHER["function"]["parameters"])
        )
        request = omni_pb2.ChatRequest(
            model=model_name,
            messages=[omni_pb2.Message(role="user", content=[omni_pb2.ContentPart(text="Weather in Oslo?")])],
            sampling=common_pb2.SamplingParams(max_tokens=64, temperature=0),
            tools=[tool],
            tool_choice_function="get_weather",
        )
        chunks = list(stub.Chat(request, timeout=120))
        (call,) = next(c for c in chunks if c.tool_calls).tool_calls
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
        assert chunks[-1].finish_reason == "tool_calls" and not any(c.text for c in chunks)
        # "auto" (no choice given) over gRPC too: answered as structured output, content or a call
        auto = omni_pb2.ChatRequest(model=model_name, messages=request.messages, tools=[tool],
                                    sampling=common_pb2.SamplingParams(max_tokens=200, temperature=0))  # fmt: skip
        chunks = list(stub.Chat(auto, timeout=120))
        calls, finish = [c for chunk in chunks for c in chunk.tool_calls], chunks[-1].finish_reason
        assert finish in ("tool_calls", "stop", "length")  # length: a reply or a call max_tokens cut
        if finish == "tool_calls":
            assert calls and all(c.name == "get_weather" and json.loads(c.arguments)["city"] for c in calls)
        if finish == "stop":
            assert not calls
    finally:
        channel.close()
