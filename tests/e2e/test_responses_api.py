"""The Responses API with the official SDK on the tiny deployment: text in (a string, or message
items with an image), text out whole or as typed events in OpenAI's order, `text.format` as
structured output, a function-call round trip, audio out (omniray's extension), and the stored-state
fields refused with a 400 that says so."""

from __future__ import annotations

import base64
import io
import json

import av
import openai
import pytest

from tests.conftest import data_url, png_bytes

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                   "required": ["city"], "additionalProperties": False},
}  # fmt: skip


def test_text_in_text_out(openai_client, model_name):
    r = openai_client.responses.create(model=model_name, input="Say hello.", max_output_tokens=16)
    assert (
        r.id.startswith("resp_")
        and r.status == "incomplete"
        and r.incomplete_details.reason == "max_output_tokens"
    )
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.output_text == r.output[0].content[0].text
    assert r.usage.output_tokens == 16 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_message_items_with_an_image_and_instructions(openai_client, model_name):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                          {"type": "input_image", "image_url": data_url(png_bytes())}]}]  # fmt: skip
    plain = openai_client.responses.create(model=model_name, input="What is this?", max_output_tokens=4)
    r = openai_client.responses.create(
        model=model_name, input=items, instructions="Be brief.", max_output_tokens=4
    )
    assert r.usage.input_tokens > plain.usage.input_tokens  # the image and instructions are in the prompt


def test_the_stream_is_typed_events_in_openais_order(openai_client, model_name):
    events = list(
        openai_client.responses.create(
            model=model_name, input="Say hello.", max_output_tokens=12, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (
        events[-1].response.output[0].content[0].text == text
        and events[-1].response.usage.output_tokens == 12
    )


def test_text_format_json_schema(openai_client, model_name):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = openai_client.responses.create(
        model=model_name, input="Is it ok?", max_output_tokens=32,
        text={"format": {"type": "json_schema", "name": "verdict", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert set(json.loads(r.output_text)) == {"ok"}


def test_a_function_call_round_trip(openai_client, model_name):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    r = openai_client.responses.create(model=model_name, input=ask, tools=[WEATHER], max_output_tokens=32,
                                       tool_choice={"type": "function", "name": "get_weather"})  # fmt: skip
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments)["city"]
    follow = [*ask, {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}]  # fmt: skip
    answer = openai_client.responses.create(model=model_name, input=follow, tools=[WEATHER], tool_choice="none",
                                            max_output_tokens=8)  # fmt: skip
    before = openai_client.responses.create(model=model_name, input=ask, tools=[WEATHER], tool_choice="none",
                                            max_output_tokens=1)  # fmt: skip
    assert answer.output[0].type == "message" and answer.usage.input_tokens > before.usage.input_tokens + 10
    # one call (an array of calls could go on until max_output_tokens with random weights)
    stream = openai_client.responses.create(model=model_name, input=ask, tools=[WEATHER], tool_choice="required",
                                            parallel_tool_calls=False, max_output_tokens=96, stream=True)  # fmt: skip
    kinds = [e.type for e in stream]
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"


def test_audio_out_extension(openai_client, model_name):
    r = openai_client.responses.create(model=model_name, input="Say hello.", max_output_tokens=8,
                                       extra_body={"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}})  # fmt: skip
    part = r.output[0].content[0].model_dump()
    assert part["type"] == "output_audio" and part["transcript"]
    with av.open(io.BytesIO(base64.b64decode(part["data"]))) as f:
        assert f.streams.audio[0].rate == 24_000 and sum(fr.samples for fr in f.decode(audio=0)) > 0


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"previous_response_id": "resp_1"}, "previous_response_id"), ({"conversation": "conv_1"}, "conversation"),
     ({"background": True}, "background"), ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
     ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type")],
)  # fmt: skip
def test_what_needs_stored_state_or_other_tools_is_refused(openai_client, model_name, extra, param):
    with pytest.raises(openai.APIStatusError) as e:
        openai_client.responses.create(model=model_name, **{"input": "hi", **extra})
    assert e.value.status_code in (400, 422) and e.value.body["param"] == param
