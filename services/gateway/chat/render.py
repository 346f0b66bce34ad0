"""Chat Completions' responses: a whole completion, or its stream of chunks (server-sent events)."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from omni.v1 import common_pb2

from services.gateway.audio.files import SpeechFile
from services.gateway.sse import reported, sse
from services.pipeline import media
from services.pipeline.events import Event
from services.pipeline.tools import CallDelta, ToolCall, joined


def chunk(rid: str, model: str, created: int, delta: dict, finish_reason: str | None = None) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(rid: str, model: str, created: int, usage: common_pb2.Usage) -> dict:
    """The last chunk with `stream_options.include_usage`: no choices, just usage."""
    return {**chunk(rid, model, created, {}), "choices": [], "usage": usage_dict(usage)}


def progress_chunk(rid: str, model: str, created: int, progress: common_pb2.Progress) -> dict:
    """omniray's progress event (documents): no choices, so OpenAI clients skip it."""
    fields = ("stage", "tiles_done", "tiles_total", "images_done", "images_total")
    return {
        **chunk(rid, model, created, {}),
        "choices": [],
        "omniray_progress": {f: getattr(progress, f) for f in fields},
    }


def usage_dict(usage: common_pb2.Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_prompt_tokens,
            "audio_tokens": usage.audio_prompt_tokens,
        },
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def completion(
    rid: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str,
    usage: common_pb2.Usage,
    audio: dict | None,
    calls: list[ToolCall] | None = None,
) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if audio is not None:
        # As OpenAI: with audio out, the words are the audio's transcript.
        message = {"role": "assistant", "content": None, "audio": audio}
    if calls is not None:
        message["tool_calls"] = [tool_call(c) for c in calls]
        message["content"] = message["content"] or None
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage_dict(usage),
    }


def tool_call(c: ToolCall, index: int | None = None) -> dict:
    out = {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
    return out if index is None else {"index": index, **out}


def tool_call_delta(d: CallDelta) -> dict:
    """A streamed call piece: the first names the call."""
    if d.id:
        return tool_call(ToolCall(d.id, d.name, d.arguments), d.index)
    return {"index": d.index, "function": {"arguments": d.arguments}}


def audio_message(audio_id: str, pcm16: bytes, sample_rate: int, fmt: str, transcript: str) -> dict:
    """A whole answer's audio message: pcm16 as it is, other formats as one file of that format
    (a WAV with its sizes written, not a stream's placeholder)."""
    if fmt == "pcm16":
        data = pcm16
    elif fmt == "wav":
        data = media.wav_bytes(pcm16, sample_rate)
    else:
        file = SpeechFile(fmt, rate=sample_rate)
        data = file.push(pcm16) + file.close()
    return {
        "id": audio_id,
        "data": base64.b64encode(data).decode(),
        "expires_at": int(time.time()) + 3600,
        "transcript": transcript,
        "format": fmt,
        "sample_rate": sample_rate,
    }


async def stream(
    events: AsyncIterator[Event], rid: str, model: str, created: int, speak: bool, include_usage: bool
) -> AsyncIterator[str]:
    """The completion as chunks; a failure after the headers went out is reported in-band, and the
    stream still ends with [DONE]."""

    async def lines() -> AsyncIterator[str]:
        audio_id = f"audio_{uuid.uuid4().hex}"
        yield sse(chunk(rid, model, created, {"role": "assistant", "content": ""}))
        async for ev in events:
            if ev.progress is not None:
                # Documents: encoder progress as a chunk with no choices (OpenAI SDKs skip those).
                yield sse(progress_chunk(rid, model, created, ev.progress))
            if ev.is_text or ev.text:
                # As OpenAI: with audio out the words stream as the audio's transcript. Tokens whose
                # text is empty go out too (as vLLM's server sends them).
                delta = {"audio": {"id": audio_id, "transcript": ev.text}} if speak else {"content": ev.text}
                yield sse(chunk(rid, model, created, delta))
            if ev.calls:  # after the words before them (one event may carry both)
                calls = [tool_call_delta(d) for d in ev.calls]
                yield sse(chunk(rid, model, created, {"tool_calls": calls}))
            if ev.pcm16:
                audio = {
                    "id": audio_id,
                    "data": base64.b64encode(ev.pcm16).decode(),
                    "sample_rate": ev.sample_rate,
                }
                yield sse(chunk(rid, model, created, {"audio": audio}))
            if ev.finish_reason:
                yield sse(chunk(rid, model, created, {}, ev.finish_reason))
                if include_usage and ev.usage is not None:
                    yield sse(usage_chunk(rid, model, created, ev.usage))

    async for line in reported(lines(), "generation failed"):
        yield line
    yield "data: [DONE]\n\n"


async def whole(
    events: AsyncIterator[Event], rid: str, model: str, created: int, speak: bool, audio_format: str
) -> dict:
    """The completion once its last event is in."""
    text, pcm, rate, finish, usage = [], bytearray(), 0, "stop", common_pb2.Usage()
    deltas: list[CallDelta] = []
    async for ev in events:
        text.append(ev.text)
        deltas += ev.calls
        pcm += ev.pcm16
        rate = ev.sample_rate or rate
        if ev.finish_reason:
            finish, usage = ev.finish_reason, ev.usage or usage
    audio = None
    if speak:
        audio = audio_message(
            f"audio_{uuid.uuid4().hex}", bytes(pcm), rate or 24000, audio_format, "".join(text)
        )
    calls = joined(deltas) if deltas else None
    return completion(rid, model, created, "".join(text), finish, usage, audio, calls)
