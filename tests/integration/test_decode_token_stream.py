"""The decode stage's token stream (what a token talker reads: services/dataplane/token_stream.py) as
the response ends, on the tiny thinker's real engine and a real Redis: an answer the engine gave up
on (vLLM aborted it under its reader) leaves the stream open — no end entry — and the decode that
resumes it (the pipeline's continuation: prompt + tokens sent) appends after it, so the talker reads
one answer to its end; so does a decode its reader cancelled mid-answer (a stall the pipeline gave
up on; Serve cancels the call's generator with CancelledError), while one cancelled after its last
chunk is whole (the end entry is written); a decode that fails writes an error entry, so the
talker stops at once rather than finish a cut-off answer as if it were whole. A lost decode that
wrote a chunk the gateway never got has its successor skip those positions (spoken once), and one
that goes on after its successor took over writes nothing more."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from omni.v1 import common_pb2, stages_pb2

from services.common.redis_config import async_client
from services.dataplane import token_stream
from services.pipeline.thinking import _continued


@pytest.fixture(scope="module")
def decode(redis_url):
    from services.models.profile import load_profile
    from services.stages.thinker import Decode

    os.environ["OMNIRAY_REDIS_URL"] = redis_url
    tiny = load_profile("tiny")
    profile = tiny.model_copy(update={"engine": tiny.engine.model_copy(update={"kv_transfer": "none"})})
    stage = Decode.func_or_class(profile.model_dump(mode="json"))
    yield stage
    stage.engine.shutdown()


def _request(ids: list[int], max_tokens: int = 40) -> stages_pb2.DecodeRequest:
    rid = uuid.uuid4().hex
    return stages_pb2.DecodeRequest(
        ctx=common_pb2.RequestContext(request_id=rid, tenant="t"),
        prompt=stages_pb2.Prompt(segments=[stages_pb2.PromptSegment(tokens=stages_pb2.TokenSpan(ids=ids))]),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0),
        token_stream=token_stream.key(rid),
    )


async def _answer(call) -> tuple[list[int], str]:
    """A decode call's tokens and finish reason, read to its end."""
    tokens, finish = [], ""
    async for chunk in call:
        tokens += chunk.token_ids
        finish = chunk.finish_reason or finish
    return tokens, finish


async def _first_tokens(call) -> list[int]:
    """A decode call read until its first chunk with tokens (the call left open)."""
    async for chunk in call:
        if chunk.token_ids:
            return list(chunk.token_ids)
    raise AssertionError("the decode ended without a token")


async def _heard(request, redis_url) -> list[int]:
    """What the talker reads from the request's token stream, to its end entry."""
    redis = async_client(redis_url)
    return [t async for ids in token_stream.read(request.token_stream, 5.0, redis) for t in ids]


async def test_an_answer_the_engine_gave_up_is_resumed_on_the_same_stream(decode, redis_url):
    request = _request(list(range(100, 140)))
    sent, finishes = [], []
    async for chunk in decode.Decode(request):
        if not sent:  # vLLM aborts it under its reader
            await decode.engine.engine.abort(f"{request.ctx.request_id}-decode")
        sent += chunk.token_ids
        finishes.append(chunk.finish_reason)
    assert sent and len(sent) < 40 and not any(finishes)  # unanswered
    rest, finish = await _answer(decode.Decode(_continued(request, sent, 1)))
    assert finish in ("stop", "length") and len(sent) + len(rest) <= 40
    assert await _heard(request, redis_url) == sent + rest  # one answer, in order, to its end entry


async def test_a_decode_its_reader_cancelled_is_resumed_on_the_same_stream(decode, redis_url):
    request = _request(list(range(100, 140)))
    call = decode.Decode(request)
    sent = await _first_tokens(call)
    # the pipeline's deadline cancelled the call: Serve throws CancelledError into the generator
    with pytest.raises(asyncio.CancelledError):
        await call.athrow(asyncio.CancelledError())
    rest, finish = await _answer(decode.Decode(_continued(request, sent, 1)))
    assert sent and finish in ("stop", "length")
    assert (
        await _heard(request, redis_url) == sent + rest
    )  # no end entry after the cancelled part: the talker reads on


async def test_a_chunk_written_but_never_sent_is_spoken_once(decode, redis_url):
    """Decode writes a chunk to the stream before it goes to the gateway: lost in between, the
    talker has a chunk the gateway lacks, which the resumed decode generates again."""
    request = _request(list(range(100, 140)), max_tokens=200)  # tokens left after two chunks
    call, chunks = decode.Decode(request), []
    async for chunk in call:
        if chunk.token_ids:
            chunks.append(list(chunk.token_ids))
        if len(chunks) == 2:
            break
    with pytest.raises(asyncio.CancelledError):
        await call.athrow(asyncio.CancelledError())
    sent, unsent = chunks  # the gateway got the first chunk only
    rest, finish = await _answer(decode.Decode(_continued(request, sent, 1)))
    assert finish in ("stop", "length") and len(rest) > len(unsent)
    # each position once: the lost decode's chunk, then the resumed decode's tokens after it
    assert await _heard(request, redis_url) == sent + unsent + rest[len(unsent) :]


async def test_a_lost_decode_that_goes_on_after_the_take_over_writes_nothing(decode, redis_url):
    """A stalled decode given up (its call's cancel not yet delivered) runs on after its successor
    took the stream over: its writes are refused and dropped; it fails nothing."""
    request = _request(list(range(100, 140)), max_tokens=200)  # tokens left for the lost one
    lost = decode.Decode(request)
    sent = await _first_tokens(lost)
    rest, finish = await _answer(decode.Decode(_continued(request, sent, 1)))
    late = [t async for chunk in lost for t in chunk.token_ids]  # the stalled one wakes up
    assert late and finish in ("stop", "length")
    assert await _heard(request, redis_url) == sent + rest


async def test_a_decode_cancelled_after_its_last_chunk_ends_the_stream(decode, redis_url):
    request = _request(list(range(100, 140)), max_tokens=8)
    call, sent = decode.Decode(request), []
    async for chunk in call:
        sent += chunk.token_ids
        if chunk.finish_reason:
            break
    with pytest.raises(asyncio.CancelledError):
        await call.athrow(asyncio.CancelledError())
    assert (
        sent and await _heard(request, redis_url) == sent
    )  # read to its end entry, not to the read's timeout


async def test_a_decode_that_fails_tells_the_talker(decode, redis_url):
    request = _request(list(range(100, 140)) * 200)  # longer than the engine's max_model_len
    with pytest.raises(Exception):  # noqa: B017 - vLLM's refusal, whatever its type
        async for _ in decode.Decode(request):
            pass
    with pytest.raises(token_stream.ThinkerFailed):
        async for _ in token_stream.read(request.token_stream, 5.0, async_client(redis_url)):
            pass
