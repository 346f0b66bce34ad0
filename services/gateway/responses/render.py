"""Responses API output: one response as a Response object, or its stream of typed events
(`sequence_number`ed, in OpenAI's order), built from the pipeline's events."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator

from omni.v1 import common_pb2

from services.gateway.audio.files import SpeechFile
from services.gateway.responses.protocol import ResponsesRequest
from services.pipeline.events import Event
from services.pipeline.tools import CallDelta, joined


class Rendered:
    """One response's output as the Responses API shows it, built from the pipeline's events: a
    message (text, or audio with its transcript) and the function calls the answer made, as output
    items in the order they began."""

    def __init__(self, req: ResponsesRequest, model: str, speak: bool, audio_format: str):
        self.req, self.model = req, model
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.speak, self.audio_format = speak, audio_format
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.text: list[str] = []
        self.pcm = bytearray()
        self.deltas: list[CallDelta] = []
        self.order: list[int | None] = []  # output items as they began: None the message, else a call
        self.item_ids: dict[int, str] = {}  # call index -> its item's id
        self.status = "in_progress"
        self.usage = common_pb2.Usage()
        self.seq = 0

    # -- the Response object

    def response(self) -> dict:
        done = self.status != "in_progress"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": self.req.instructions,
            "max_output_tokens": self.req.max_output_tokens,
            "model": self.model,
            "output": self.output() if done else [],
            "parallel_tool_calls": self.req.parallel_tool_calls,
            "previous_response_id": None,
            "store": False,
            "temperature": self.req.temperature,
            "text": {
                "format": (
                    self.req.text.format.model_dump(by_alias=True, exclude_none=True)
                    if self.req.text
                    else {"type": "text"}
                )
            },  # fmt: skip
            "tool_choice": _choice(self.req.tool_choice),
            "tools": [t.model_dump(exclude_none=True) for t in self.req.tools or ()],
            "top_p": self.req.top_p,
            "truncation": "disabled",
            "metadata": self.req.metadata or {},
            "usage": self._usage() if done else None,
        }

    def output(self) -> list[dict]:
        return [self._item(i, self.item_status) for i in self.order]

    def _item(self, index: int | None, status: str) -> dict:
        return self._message(status) if index is None else self._call_item(index, status)

    @property
    def item_status(self) -> str:
        return "completed" if self.status == "completed" else "incomplete"

    def _message(self, status: str) -> dict:
        content = [self._part()] if status != "in_progress" else []
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def _part(self, whole: bool = True) -> dict:
        text = "".join(self.text) if whole else ""
        if not self.speak:
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        part: dict = {"type": "output_audio", "transcript": text, "format": self.audio_format}
        if whole:
            part["data"] = base64.b64encode(self._audio_file()).decode()
        return part

    def _audio_file(self) -> bytes:
        fmt = "pcm" if self.audio_format == "pcm16" else self.audio_format
        file = SpeechFile(fmt)
        return file.push(bytes(self.pcm)) + file.close()

    def _call_item(self, index: int, status: str) -> dict:
        (c,) = joined([d for d in self.deltas if d.index == index])
        return {"id": self.item_ids[index], "type": "function_call", "status": status, "call_id": c.id,
                "name": c.name, "arguments": c.arguments if status != "in_progress" else ""}  # fmt: skip

    def _indices(self) -> list[int]:
        return sorted({d.index for d in self.deltas})

    def _usage(self) -> dict:
        u = self.usage
        return {
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": u.cached_prompt_tokens,
                "cache_write_tokens": 0,
                "audio_tokens": u.audio_prompt_tokens,
            },
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens,
        }

    def _finished(self, ev: Event) -> None:
        self.usage = ev.usage or self.usage
        self.status = "incomplete" if ev.finish_reason == "length" else "completed"

    def _took(self, ev: Event) -> tuple[bool, list[CallDelta]]:
        """An event into the output: (whether it adds to the message, the call pieces that begin
        a call)."""
        content = bool(ev.is_text or ev.text or ev.pcm16)
        if content:
            self.text.append(ev.text)
            self.pcm += ev.pcm16
        begun = []
        for d in ev.calls:
            self.deltas.append(d)
            if d.index not in self.item_ids:
                self.item_ids[d.index] = f"fc_{uuid.uuid4().hex}"
                begun.append(d)
        return content, begun

    # -- whole

    async def whole(self, events: AsyncIterator[Event]) -> dict:
        message = False
        async for ev in events:
            content, _ = self._took(ev)
            message = message or content
            if ev.finish_reason:
                self._finished(ev)
        self.order = ([None] if message or not self.item_ids else []) + self._indices()
        return self.response()

    # -- stream

    def _event(self, kind: str, **fields) -> str:
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.seq, **fields})}\n\n"

    async def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        """The message begins at its first content and ends with the answer (its audio may follow
        the words before a call); each call is added when it begins and its arguments stream as they
        are written; the calls are done after the message."""
        yield self._event("response.created", response=self.response())
        yield self._event("response.in_progress", response=self.response())
        part = {}  # the open message's item id and content index, with its output index
        async for ev in events:
            content, begun = self._took(ev)
            if content and not part and None not in self.order:
                for line in self._message_added():
                    yield line
                part = {
                    "item_id": self.message_id,
                    "output_index": self.order.index(None),
                    "content_index": 0,
                }
            if ev.is_text or ev.text:
                kind = "response.audio.transcript.delta" if self.speak else "response.output_text.delta"
                extra = {} if self.speak else {"logprobs": []}
                yield self._event(kind, delta=ev.text, **part, **extra)
            if ev.pcm16:
                yield self._event("response.audio.delta", delta=base64.b64encode(ev.pcm16).decode(), **part)
            for d in ev.calls:
                if d in begun:
                    self.order.append(d.index)
                    item = self._call_item(d.index, "in_progress")
                    yield self._event(
                        "response.output_item.added", item=item, output_index=len(self.order) - 1
                    )
                if d.arguments:
                    yield self._event("response.function_call_arguments.delta", item_id=self.item_ids[d.index],
                                      output_index=self.order.index(d.index), delta=d.arguments)  # fmt: skip
            if ev.finish_reason:
                self._finished(ev)
        if not self.order:  # an empty answer is an empty message
            for line in self._message_added():
                yield line
            part = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        if part:
            for line in self._message_done(part):
                yield line
        for i, index in enumerate(self.order):
            if index is not None:
                item = self._call_item(index, self.item_status)
                yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                  name=item["name"], arguments=item["arguments"])  # fmt: skip
                yield self._event("response.output_item.done", item=item, output_index=i)
        done = "response.incomplete" if self.status == "incomplete" else "response.completed"
        yield self._event(done, response=self.response())

    def _message_added(self) -> list[str]:
        self.order.append(None)
        at = {"output_index": len(self.order) - 1}
        return [
            self._event("response.output_item.added", item=self._message("in_progress"), **at),
            self._event(
                "response.content_part.added",
                part=self._part(whole=False),
                item_id=self.message_id,
                content_index=0,
                **at,
            ),  # fmt: skip
        ]

    def _message_done(self, part: dict) -> list[str]:
        text = "".join(self.text)
        status = self.item_status if self.status != "in_progress" else "completed"
        if self.speak:
            lines = [self._event("response.audio.done", **part),
                     self._event("response.audio.transcript.done", transcript=text, **part)]  # fmt: skip
        else:
            lines = [self._event("response.output_text.done", text=text, logprobs=[], **part)]
        return lines + [
            self._event("response.content_part.done", part=self._part(), **part),
            self._event(
                "response.output_item.done", item=self._message(status), output_index=part["output_index"]
            ),
        ]

    def failed(self, error: dict) -> str:
        self.status = "failed"
        response = {**self.response(), "error": {"code": error.get("code") or "server_error",
                                                  "message": error["message"]}}  # fmt: skip
        return self._event("response.failed", response=response)


def _choice(choice) -> str | dict:
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else {"type": "function", "name": choice.name}
