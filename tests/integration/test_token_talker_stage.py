"""Qwen3-Omni's talker stage (services/stages/speech.py, a token talker) on `qwen3-omni-tiny` and a
real Redis: it reads the thinker's tokens from the response's token stream as decode writes them and
stops where the text ends — at a tool call's marker (ThinkerOutput.stop_token_ids) without waiting
for the thinker to finish the call — and says on its last chunk when its frame limit (the talker's
`max_frames`) cut the speech, so the response ends incomplete. Through the gateway's pipeline (the
real talker and code2wav stages; decode a stand-in that writes a scripted answer as the decode stage
does): the words an answer says before its tool call are spoken whole, not cut when the call is
parsed; a response whose speech the frame limit cut finishes `length`, as does one whose marker
began no call (the talker stopped there; the rest of the text is content it never spoke)."""

from __future__ import annotations

import functools
import os
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
from omni.v1 import common_pb2, stages_pb2

from services.common.redis_config import async_client
from services.dataplane import tensors, token_stream
from services.models.profile import load_profile
from services.pipeline.pipeline import Pipeline
from services.pipeline.prompt import PromptBuilder
from services.pipeline.tools import Tool, Tools
from services.pipeline.turn import Message, Sampling, SpeechOut, Turn
from services.quota.buckets import Buckets
from services.quota.service import QuotaService
from services.quota.tenants import Tenants, TenantSpec

SEED = 1  # these draws do not end the speech before its text's share (random weights may)


@pytest.fixture(scope="module")
def profile(redis_url):
    os.environ["OMNIRAY_REDIS_URL"] = redis_url
    return load_profile("qwen3-omni-tiny")


@pytest.fixture(scope="module")
def prompt_ids(profile) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(profile.model_path(profile.models.thinker))
    chat = [{"role": "user", "content": "What is the weather in Paris?"}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)


def _talker(profile, **options):
    from services.stages.speech import Talker

    spec = profile.models.talker
    talker = spec.model_copy(update={"options": spec.options.model_copy(update=options)})
    changed = profile.model_copy(update={"models": profile.models.model_copy(update={"talker": talker})})
    return Talker.func_or_class(changed.model_dump(mode="json"))


async def _talk(stage, prompt_ids, tokens, *, end: bool, stop=()) -> list[stages_pb2.UnitChunk]:
    rid = uuid.uuid4().hex
    client = async_client()
    writer = token_stream.TokenStreamWriter(token_stream.key(rid), client)
    await writer.take_over()
    await writer.add(tokens)
    if end:
        await writer.end()
    request = stages_pb2.TalkRequest(
        ctx=common_pb2.RequestContext(request_id=rid, tenant="t"),
        voice="aiden",
        seed=SEED,
        thinker=stages_pb2.ThinkerOutput(
            prompt_ids=prompt_ids, token_stream=token_stream.key(rid), stop_token_ids=stop
        ),
    )
    chunks = [chunk async for chunk in stage.Talk(request)]
    await client.aclose()
    return chunks


def _frames(chunks) -> np.ndarray:
    return np.concatenate([tensors.materialize(c.units) for c in chunks if not c.is_final])


async def test_a_tool_calls_marker_ends_the_speech_as_the_thinkers_end(profile, prompt_ids):
    stage = _talker(profile)
    marker = 151657  # Qwen's <tool_call>: one token of the vocabulary
    eos = stage.model.config.im_end_token_id
    ended = await _talk(stage, prompt_ids, [100, 200, 300, eos], end=True)
    # The thinker is still writing its call: no end entry, yet the talk ends at the marker.
    calling = await _talk(stage, prompt_ids, [100, 200, 300, marker, 400, 500], end=False, stop=[marker])
    np.testing.assert_array_equal(_frames(calling), _frames(ended))
    assert calling[-1].is_final and not calling[-1].truncated and not ended[-1].truncated


async def test_speech_cut_at_the_frame_limit_says_so(profile, prompt_ids):
    whole = await _talk(_talker(profile), prompt_ids, [100, 200, 300], end=True)
    cut = await _talk(_talker(profile, max_frames=6), prompt_ids, [100, 200, 300], end=True)
    assert len(_frames(whole)) > 6 and not whole[-1].truncated
    assert cut[-1].is_final and cut[-1].truncated
    np.testing.assert_array_equal(_frames(cut), _frames(whole)[: len(_frames(cut))])
    assert len(_frames(cut)) <= 6


class _Handle:
    """A stage object behind the calls the pipeline makes on a deployment handle (the requests kept)."""

    def __init__(self, stage):
        self._stage, self.requests = stage, []

    def options(self, **_):
        return self

    def __getattr__(self, method: str):
        def remote(request):
            self.requests.append(request)
            return getattr(self._stage, method)(request)

        return SimpleNamespace(remote=remote)


class _ScriptedDecode:
    """The decode stage's side of a response, scripted: each chunk's token ids written to the
    response's token stream, then streamed with their text (as services/stages/thinker.py does)."""

    def __init__(self, tokenizer, chunks: list[list[int]]):
        self.tokenizer, self.chunks = tokenizer, chunks

    async def Decode(self, request: stages_pb2.DecodeRequest):
        writer = token_stream.TokenStreamWriter(request.token_stream)
        await writer.take_over()
        total = sum(map(len, self.chunks))
        for i, ids in enumerate(self.chunks):
            await writer.add(ids)
            last = i == len(self.chunks) - 1
            usage = common_pb2.Usage(prompt_tokens=1, completion_tokens=total, total_tokens=total + 1)
            yield stages_pb2.DecodeChunk(
                token_ids=ids,
                text=self.tokenizer.decode(ids),
                finish_reason="stop" if last else "",
                usage=usage if last else None,
            )
        await writer.end()


async def _generate(profile, talker, chunks, tools: Tools | None = None):
    """A response through the pipeline on these stages (decode: `chunks`, scripted): its events and
    the stage handles (with the requests they were given)."""
    from services.stages.speech import Vocoder

    prompts = _prompts(str(profile.model_path(profile.models.thinker)))
    decode = _ScriptedDecode(prompts.tokenizer, chunks)
    vocoder = Vocoder.func_or_class(profile.model_dump(mode="json"))
    handles = {"decode": _Handle(decode), "talker": _Handle(talker), "vocoder": _Handle(vocoder)}
    redis = async_client()
    quota = QuotaService(Tenants(None), Buckets(redis, prefix=f"t{uuid.uuid4().hex}"))
    pipeline = Pipeline(profile, SimpleNamespace(**handles), prompts, quota)
    turn = Turn(
        profile.served_model_name,
        (Message("user", ("Weather in Paris?",)),),
        sampling=Sampling(seed=SEED),
        speech=SpeechOut("aiden"),
        tools=tools,
    )
    try:
        return [e async for e in pipeline.generate(await pipeline.prepare(turn, TenantSpec(id="t")))], handles
    finally:
        await redis.aclose()


@functools.cache
def _prompts(model_path: str) -> PromptBuilder:
    return PromptBuilder(model_path)


def _tokens(profile, text: str) -> list[int]:
    return _prompts(str(profile.model_path(profile.models.thinker))).tokenizer.encode(
        text, add_special_tokens=False
    )


def _weather() -> Tools:
    schema = '{"type": "object", "properties": {"city": {"type": "string"}}}'
    return Tools((Tool("get_weather", "The weather", schema),), "auto")


async def test_the_words_before_a_tool_call_are_spoken_whole(profile):
    talker = _talker(profile)
    lead_in = _tokens(profile, "Let me check.")
    call = _tokens(profile, '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n')
    events, handles = await _generate(
        profile, talker, [lead_in, [151657, *call[:4]], [*call[4:], 151658]], _weather()
    )
    assert [d.name for e in events for d in e.calls if d.name] == ["get_weather"]
    assert events[-1].finish_reason == "tool_calls"
    assert "".join(e.text for e in events) == "Let me check."
    pcm = b"".join(e.pcm16 for e in events if e.pcm16)
    assert [e.transcript for e in events if e.transcript] == ["Let me check."]
    # All the speech the talker has for the lead-in (ended as at the thinker's eos), not a cut.
    (talk,) = handles["talker"].requests
    assert list(talk.thinker.stop_token_ids) == [151657]
    eos = talker.model.config.im_end_token_id
    said = _frames(await _talk(talker, list(talk.thinker.prompt_ids), [*lead_in, eos], end=True))
    vocoded = sum(tensors.materialize(r.units).shape[0] for r in handles["vocoder"].requests)
    assert vocoded == len(said) and len(pcm) // 2 > 0.95 * len(said) * 1920  # 1920 samples a frame


async def test_a_response_whose_speech_the_frame_limit_cut_is_incomplete(profile):
    answer = _tokens(profile, "It is sunny in Paris today.")
    events, _ = await _generate(profile, _talker(profile, max_frames=6), [answer])
    assert "".join(e.text for e in events) == "It is sunny in Paris today."
    assert any(e.pcm16 for e in events) and events[-1].finish_reason == "length"
    whole, _ = await _generate(profile, _talker(profile), [answer])
    assert whole[-1].finish_reason == "stop"


async def test_a_marker_that_begins_no_call_leaves_the_speech_incomplete(profile):
    """The talker stops at the marker; the parser then finds no call in what follows, which is
    content: the text goes on where the speech does not, so the response is not complete."""
    lead_in, junk = _tokens(profile, "Let me check."), _tokens(profile, " not a call at all")
    events, handles = await _generate(profile, _talker(profile), [lead_in, [151657, *junk]], _weather())
    assert not [d for e in events for d in e.calls]
    assert "".join(e.text for e in events) == "Let me check.<tool_call> not a call at all"
    # (the transcript is the text written when the audio went out: here all of it, the known limit)
    assert "".join(e.transcript for e in events if e.transcript).startswith("Let me check.")
    assert any(e.pcm16 for e in events) and events[-1].finish_reason == "length"
