"""An answer that says something and then calls a function (tool_choice "auto" on a model with a
tool parser) goes out in OpenAI's order: over realtime, the message item (added, its deltas), the
function_call item added when the call begins (its arguments' deltas), then the message done (its
audio may still come after the call began) and the call done, then `response.done` listing both;
over the Responses API, the same two output items in its stream and its whole response. The
pipeline's events are scripted: which text is a call is the parser's business
(tests/unit/test_tool_parser.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from omni.v1 import common_pb2

from services.gateway.responses.protocol import ResponsesRequest
from services.gateway.responses.render import Rendered
from services.pipeline.events import Event
from services.pipeline.tools import CallDelta
from tests.unit.realtime.test_session_bounds import Pipeline, _profile, _session

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
SCRIPT = [
    Event(text="Let me ", tokens=2),
    # the last words and the call's first piece in one event, as the parser may split them
    Event(text="check.", tokens=3, calls=(CallDelta(0, '{"city": ', "call_1", "get_weather"),)),
    Event(tokens=2, calls=(CallDelta(0, '"Paris"}'),)),
    Event(finish_reason="tool_calls", usage=common_pb2.Usage(prompt_tokens=20, completion_tokens=9)),
]

# the output items' events, the same over realtime and the Responses API
MESSAGE_THEN_CALL = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.function_call_arguments.done",
    "response.output_item.done",
]


class Calling(Pipeline):
    # the model's own call format (a tool parser): "auto" is generated under no schema
    checks = SimpleNamespace(tool_schema=lambda tools, structured=False: "")

    async def generate(self, prepared):
        for ev in SCRIPT:
            yield ev


async def test_realtime_sends_the_message_then_the_call():
    profile = _profile()
    s, sent = await _session(profile, Calling(profile), tools=[WEATHER], output_modalities=["text"])
    await s.handle(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}}))  # fmt: skip
    sent.clear()
    await s.handle(json.dumps({"type": "response.create"}))
    await s.response.task
    kinds = [e["type"] for e in sent if not e["type"].startswith(("rate_limits", "conversation.item"))]
    assert kinds == ["response.created", *MESSAGE_THEN_CALL, "response.done"]
    added = [e for e in sent if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [(0, "message"), (1, "function_call")]
    done = sent[-1]["response"]
    assert done["status"] == "completed" and [o["type"] for o in done["output"]] == [
        "message",
        "function_call",
    ]
    assert done["output"][0]["content"][0]["text"] == "Let me check."
    assert (done["output"][1]["name"], json.loads(done["output"][1]["arguments"])) == (
        "get_weather",
        {"city": "Paris"},
    )
    # both are in the conversation, in order
    assert [i.kind for i in s.conversation.items[-2:]] == ["message", "function_call"]


async def _events():
    for ev in SCRIPT:
        yield ev


async def test_the_responses_api_lists_the_message_then_the_call():
    req = ResponsesRequest(model="m", input="Weather?", tools=[WEATHER])
    lines = [line async for line in Rendered(req, "m", False, "pcm16").stream(_events())]
    events = [json.loads(line.split("data: ", 1)[1]) for line in lines]
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", *MESSAGE_THEN_CALL, "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
    streamed = events[-1]["response"]
    whole = await Rendered(req, "m", False, "pcm16").whole(_events())
    for response in (streamed, whole):
        assert [o["type"] for o in response["output"]] == ["message", "function_call"]
        assert response["output"][0]["content"][0]["text"] == "Let me check."
        call = response["output"][1]
        assert (call["call_id"], call["name"], call["arguments"]) == (
            "call_1",
            "get_weather",
            '{"city": "Paris"}',
        )
