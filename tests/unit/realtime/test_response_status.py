"""How a realtime response ends, as OpenAI's Realtime API says it: `completed` when the model
stopped, `incomplete` (status_details reason `max_output_tokens`) when its token limit did — the
message item `incomplete` too, both in the response and in the conversation. Driven through
`RealtimeSession.handle` with a pipeline stand-in that ends its reply as the engine would."""

from __future__ import annotations

import json

import pytest
from omni.v1 import common_pb2

from services.pipeline.events import Event
from tests.unit.realtime.test_session_bounds import Pipeline, _profile, _session


class Ending(Pipeline):
    def __init__(self, profile, finish_reason: str):
        super().__init__(profile)
        self.finish_reason = finish_reason

    async def generate(self, prepared):
        yield Event(text="two words", tokens=2)
        usage = common_pb2.Usage(prompt_tokens=prepared.prompt_tokens, completion_tokens=2)
        yield Event(finish_reason=self.finish_reason, usage=usage)


@pytest.mark.parametrize(
    ("finish_reason", "status", "details", "item_status"),
    [
        ("stop", "completed", {"type": "completed", "reason": None, "error": None}, "completed"),
        ("length", "incomplete", {"type": "incomplete", "reason": "max_output_tokens", "error": None}, "incomplete"),
    ],
)  # fmt: skip
async def test_a_response_ends_as_its_generation_did(finish_reason, status, details, item_status):
    profile = _profile()
    s, sent = await _session(
        profile, Ending(profile, finish_reason), output_modalities=["text"], max_output_tokens=2
    )
    await s.handle(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}}))  # fmt: skip
    sent.clear()
    await s.handle(json.dumps({"type": "response.create"}))
    await s.response.task
    done = sent[-1]
    assert done["type"] == "response.done"
    assert (done["response"]["status"], done["response"]["status_details"]) == (status, details)
    assert [o["status"] for o in done["response"]["output"]] == [item_status]
    item_done = next(e for e in sent if e["type"] == "conversation.item.done")
    assert item_done["item"]["status"] == item_status
    assert done["response"]["usage"]["output_tokens"] == 2
    assert not s.busy  # the session takes the next response
