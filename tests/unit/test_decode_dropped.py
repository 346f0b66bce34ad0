"""A decode stream that ends with no finish reason — its engine gave the request up (vLLM's `error`
or `abort`: services/engine/thinker.py ends the stream there) — is not an answer's end: the pipeline
resumes the response from the tokens already sent, as for a lost replica, counted under
`cause="engine_dropped"`; when it cannot (resume off, a grammar), the client gets the 503
`stage_unavailable`, never a response reported complete. The decode deployment is a stand-in that
streams real `DecodeChunk`s as the thinker stage does (the engine side: tests/integration/
test_session_kv_engine.py; a killed replica: tests/e2e/faults/test_replica_faults.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omni.v1 import common_pb2, stages_pb2

from services.common.errors import OmniError
from services.models.profile import load_profile
from services.pipeline.stage_calls import stage_calls
from services.pipeline.stage_deadlines import StageDeadlines
from services.pipeline.thinking import Thinking

PROMPT = [5, 6, 7]


class Decode:
    """The decode deployment's handle: each call streams the next of `streams` (token ids per chunk,
    and the last chunk's finish reason, "" for none)."""

    def __init__(self, streams: list[tuple[list[list[int]], str]]):
        self.streams, self.requests = list(streams), []
        self.Decode = SimpleNamespace(remote=self._remote)

    def options(self, **_):
        return self

    async def _remote(self, request: stages_pb2.DecodeRequest):
        self.requests.append(request)
        chunks, finish = self.streams.pop(0)
        prompt = sum(len(s.tokens.ids) for s in request.prompt.segments)
        completion = sum(map(len, chunks))
        for i, ids in enumerate(chunks):
            # the engine's usage, on the last chunk: it counts what it was handed as prompt
            usage = common_pb2.Usage(prompt_tokens=prompt, completion_tokens=completion,
                                     total_tokens=prompt + completion)  # fmt: skip
            last = i == len(chunks) - 1
            yield stages_pb2.DecodeChunk(
                token_ids=ids, finish_reason=finish if last else "", usage=usage if last else None
            )


def _thinking(decode: Decode, **resume) -> Thinking:
    profile = load_profile("tiny")
    pipe = profile.pipeline.model_copy(
        update={"decode_resume": profile.pipeline.decode_resume.model_copy(update={"retry_s": 0, **resume})}
    )
    profile = profile.model_copy(update={"pipeline": pipe})
    return Thinking(profile, SimpleNamespace(decode=decode), StageDeadlines(pipe.stage_deadlines))


def _request(max_tokens: int = 10, **sampling) -> stages_pb2.DecodeRequest:
    return stages_pb2.DecodeRequest(
        ctx=common_pb2.RequestContext(request_id="r"),
        prompt=stages_pb2.Prompt(
            segments=[stages_pb2.PromptSegment(tokens=stages_pb2.TokenSpan(ids=PROMPT))]
        ),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, **sampling),
        kv_transfer_params="handed-off",
    )


async def _run(thinking: Thinking, request: stages_pb2.DecodeRequest) -> list[stages_pb2.DecodeChunk]:
    with stage_calls():
        return [chunk async for chunk in thinking._decode(thinking.h.decode, request, {})]


async def test_a_dropped_decode_goes_on_from_the_tokens_sent():
    decode = Decode([([[1], [2, 3]], ""), ([[4], [5]], "length")])
    chunks = await _run(_thinking(decode), _request(max_tokens=5))
    assert [t for c in chunks for t in c.token_ids] == [1, 2, 3, 4, 5]
    assert [c.finish_reason for c in chunks] == ["", "", "", "length"]
    again = decode.requests[1]
    # the prompt and the tokens sent, computed again; what is left of max_tokens; no hand-off
    assert [list(s.tokens.ids) for s in again.prompt.segments] == [PROMPT, [1, 2, 3]]
    assert again.sampling.max_tokens == 2 and again.kv_transfer_params == ""
    # the resent tokens count as generated, not as prompt
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (len(PROMPT), 5)


async def test_a_decode_dropped_before_any_token_is_asked_again():
    decode = Decode([([[]], ""), ([[1, 2]], "stop")])
    chunks = await _run(_thinking(decode), _request())
    assert [t for c in chunks for t in c.token_ids] == [1, 2] and chunks[-1].finish_reason == "stop"
    assert [list(s.tokens.ids) for s in decode.requests[1].prompt.segments] == [PROMPT]


@pytest.mark.parametrize(
    ("resume", "sampling"),
    [({"enabled": False}, {}), ({}, {"json_object": True})],
    ids=["resume off", "under a grammar"],
)
async def test_a_dropped_decode_that_cannot_go_on_is_a_503_not_an_answer(resume, sampling):
    decode = Decode([([[1]], ""), ([[2]], "stop")])
    with pytest.raises(OmniError) as e:
        await _run(_thinking(decode, **resume), _request(**sampling))
    assert (e.value.status, e.value.code) == (503, "stage_unavailable")
    assert len(decode.requests) == 1
