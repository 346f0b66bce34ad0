"""Qwen3-Omni's talker stage (services/stages/speech.py, a token talker) on `qwen3-omni-tiny` and a
real Redis: it reads the thinker's tokens from the response's token stream as decode writes them and
stops where the text ends — at a tool call's marker (ThinkerOutput.stop_token_ids) without waiting
for the thinker to finish the call — and says on its last chunk when its frame limit (the talker's
`max_frames`) cut the speech, so the response ends incomplete."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
from omni.v1 import common_pb2, stages_pb2

from services.common.redis_config import async_client
from services.dataplane import tensors, token_stream
from services.models.profile import load_profile

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
