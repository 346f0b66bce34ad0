"""AIMD admission reads the decode engine's frame time (services/policies/admission.py): a session
producing speech observes frame time over the audio one of its tokens yields, so an engine slower
than real time lowers the limit and a fast one raises it — however long the gaps between its audio
deltas (a response paced to playback is not late). Driven through `RealtimeSession.handle` with the
pipeline stand-in of test_session_bounds, whose answers now carry frame times and audio."""

from __future__ import annotations

import asyncio
import json

from omni.v1 import common_pb2

from services.pipeline.events import Event
from services.policies.admission import AdmissionParams
from services.realtime.session import PCM_RATE
from tests.unit.realtime.test_session_bounds import Pipeline, _profile, _session

TOKENS, MS_PER_TOKEN = 4, 100.0  # each answer: 4 tokens, 100 ms of audio per token


class Speaking(Pipeline):
    """Answers of TOKENS tokens, each text piece with the engine's frame time, then its audio;
    `gap_s` between pieces (a paced response waits between its batches)."""

    def __init__(self, profile, frame_ms: float, gap_s: float = 0.0):
        super().__init__(profile)
        self.frame_ms, self.gap_s = frame_ms, gap_s

    async def generate(self, prepared):
        for _ in range(TOKENS):
            yield Event(text="word ", tokens=1, frame_ms=self.frame_ms)
            await asyncio.sleep(self.gap_s)
            yield Event(pcm16=bytes(int(PCM_RATE * MS_PER_TOKEN / 1000) * 2), sample_rate=PCM_RATE)
        usage = common_pb2.Usage(prompt_tokens=prepared.prompt_tokens, completion_tokens=TOKENS)
        yield Event(finish_reason="stop", usage=usage)


async def _limit_after(frame_ms: float, responses: int, gap_s: float = 0.0) -> float:
    # window 4: one answer's observations move the limit once
    admission = AdmissionParams(initial=8, min=1, max=16, window=TOKENS, decrease=0.5)
    profile = _profile(admission=admission)
    s, sent = await _session(profile, Speaking(profile, frame_ms, gap_s), output_modalities=["audio"])
    for _ in range(responses):
        await s.handle(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))  # fmt: skip
        await s.handle(json.dumps({"type": "response.create"}))
        await s.response.task
        assert s.response.status == "completed", [e for e in sent if e["type"] == "error"]
    return s.admission.limit


async def test_an_engine_slower_than_real_time_lowers_the_limit():
    # the first answer measures the session's audio per token (nothing to compare with before it)
    assert await _limit_after(frame_ms=3 * MS_PER_TOKEN, responses=1) == 8
    assert await _limit_after(frame_ms=3 * MS_PER_TOKEN, responses=3) == 2  # 8 x 0.5 x 0.5


async def test_an_engine_faster_than_real_time_raises_it_even_when_audio_comes_in_paced_batches():
    # 0.2 s between deltas of 0.1 s of audio: late by delivery, on time by the engine's frames
    assert await _limit_after(frame_ms=0.2 * MS_PER_TOKEN, responses=3, gap_s=0.2) == 10
