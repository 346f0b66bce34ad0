"""A realtime session's resources stay bounded however long it runs (issue 15, part 7): server VAD
keeps only the prefix padding's worth of a silent open microphone, a turn is its speech and padding
(not the silence around it), and the conversation a response sends is a window of the newest turns
that fits the request's limits. Driven through `RealtimeSession.handle` with a pipeline stand-in
that builds prompts of the real shape (one embedding segment per audio clip)."""

from __future__ import annotations

import base64
import json
import math
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from omni.v1 import common_pb2, stages_pb2

from loadtest.clients.speech import speech
from services.common.errors import bad_request
from services.models.profile import load_profile
from services.pipeline.events import Event
from services.pipeline.prompt import prompt_tokens
from services.pipeline.turn import AudioClip
from services.playback.monitor import PlaybackMonitor
from services.policies.admission import AimdAdmission
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.session import PCM_RATE, RealtimeSession

BYTES_PER_MS = PCM_RATE * 2 // 1000
HEADER = 4  # template tokens around each message in the stand-in's prompts
ROWS_PER_S = 25  # embeddings per second of audio, as the tiny audio encoder


class Quota:
    async def spend_session_audio(self, tenant, session_id: str, seconds: float) -> None:
        pass


class Pipeline:
    """Renders a chat request as the prompt builder does in shape: HEADER tokens and a token per
    word for each message, one embedding segment per audio clip; refuses a prompt over the context
    length as `Pipeline.prepare` does. Records what it was asked."""

    def __init__(self, profile, reply_words: int = 3):
        self.profile, self.reply_words = profile, reply_words
        self.quota = Quota()
        self.prepared: list[SimpleNamespace] = []
        self.ahead: list = []
        self.refused = 0

    def _prompt(self, turn) -> stages_pb2.Prompt:
        prompt, ids = stages_pb2.Prompt(), [1] * HEADER
        for message in turn.messages:
            for part in message.parts:
                if isinstance(part, AudioClip):
                    prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=ids))
                    rows = max(1, math.ceil(part.seconds * ROWS_PER_S))
                    prompt.segments.add(embeddings=common_pb2.TensorDescriptor(shape=[rows, 8]))
                    ids = []
                else:
                    ids += [1] * len(part.split())
            ids += [1] * HEADER
        prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=ids))
        return prompt

    async def prepare(self, req, tenant) -> SimpleNamespace:
        prompt = self._prompt(req)
        tokens, max_tokens = prompt_tokens(prompt), req.sampling.max_tokens or 64
        if tokens + max_tokens > self.profile.engine.max_model_len:
            self.refused += 1
            raise bad_request("prompt too long", code="context_length_exceeded", param="messages")
        prepared = SimpleNamespace(
            request=req,
            prompt=prompt,
            prompt_tokens=tokens,
            max_tokens=max_tokens,
            lease=SimpleNamespace(buckets=[]),
        )
        self.prepared.append(prepared)
        return prepared

    async def generate(self, prepared):
        n = self.reply_words
        yield Event(text="word " * n, tokens=n)
        yield Event(finish_reason="stop", usage=common_pb2.Usage(prompt_tokens=prepared.prompt_tokens))

    async def prefill_ahead(self, req, tenant) -> int:
        self.ahead.append(req)
        return 0


class Stats:
    def __init__(self):
        self.dropped = 0

    def history_trimmed(self, turns: int) -> None:
        self.dropped += turns

    def prefilled_ahead(self, outcome: str, tokens: int) -> None:
        pass

    def barge_in(self, wasted_tokens: int) -> None:
        pass

    def generated(self, tokens: int) -> None:
        pass


def _pcm16(item) -> bytes:
    """A user item's audio as the pcm16 the client sent (clips hold it as exact float32 samples)."""
    samples = np.concatenate([clip.samples() for clip in item.clips]) if item.clips else np.zeros(0)
    return np.round(samples * 32768.0).astype("<i2").tobytes()


def _profile(**realtime):
    profile = load_profile("tiny")
    return profile.model_copy(update={"realtime": profile.realtime.model_copy(update=realtime)})


async def _session(profile, pipeline: Pipeline | None = None, **session) -> tuple[RealtimeSession, list]:
    sent: list[dict] = []

    async def send(event: se.ServerEvent) -> None:
        sent.append(json.loads(se.to_json(event)))  # as the WebSocket carries it

    s = RealtimeSession(
        pipeline or Pipeline(profile), profile, SimpleNamespace(id="t"), "sess_1", send,
        PlaybackMonitor(), AimdAdmission(profile.realtime.admission), Stats(),
    )  # fmt: skip
    await s.start()
    if session:
        await s.handle(json.dumps({"type": "session.update", "session": {"type": "realtime", **session}}))
    return s, sent


def _append(pcm: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def _errors(sent: list[dict]) -> list[dict]:
    return [e["error"] for e in sent if e["type"] == "error"]


def _tone(seconds: float, freq: float = 180.0) -> bytes:
    t = np.arange(int(seconds * PCM_RATE)) / PCM_RATE
    return (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()


# ---- server VAD: silence is not kept ------------------------------------------------------------


async def test_a_silent_open_microphone_keeps_only_the_prefix_padding():
    """5 minutes of a quiet room (faint noise) in 100 ms appends: no error, no speech, and after
    every append the buffer holds at most the prefix padding (300 ms) plus one VAD window."""
    s, sent = await _session(_profile())
    rng = np.random.default_rng(0)
    step, largest = 100 * BYTES_PER_MS, 0
    for _ in range(5 * 60 * 10):
        noise = (rng.normal(0, 30, step // 2)).astype("<i2").tobytes()
        await s.handle(_append(noise))
        largest = max(largest, len(s.input.buffer))
    assert _errors(sent) == [] and not [e for e in sent if e["type"].startswith("input_audio_buffer.")]
    assert largest <= (300 + 33) * BYTES_PER_MS
    assert s.input.input_ms == pytest.approx(5 * 60 * 1000)  # positions still count every sample


async def test_without_server_vad_the_client_decides_and_the_buffer_limit_holds():
    s, sent = await _session(_profile(), audio={"input": {"turn_detection": None}})
    for _ in range(8):  # 120 s: the limit
        await s.handle(_append(bytes(15 * 1000 * BYTES_PER_MS)))
    assert _errors(sent) == [] and len(s.input.buffer) == 120 * 1000 * BYTES_PER_MS
    await s.handle(_append(bytes(1000 * BYTES_PER_MS)))
    assert [e["code"] for e in _errors(sent)] == ["input_audio_buffer_full"]


@pytest.fixture(scope="module")
def two_sentences() -> tuple[bytes, bytes, bytes]:
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng to speak")
    first = speech("Please tell me everything you know about the history of Paris.")
    second = speech("And what about London?")
    return first, second, bytes(1500 * BYTES_PER_MS)


async def test_a_turn_is_its_speech_and_padding_at_the_reported_positions(two_sentences):
    """Silence, a sentence, silence, a sentence, silence: each committed user item is exactly the
    input between its `speech_started.audio_start_ms` and `speech_stopped.audio_end_ms`; the silence
    before (beyond the padding) and after is not in it, and the buffer is back to the padding."""
    first, second, silence = two_sentences
    pcm = bytes(2000 * BYTES_PER_MS) + first + silence + second + silence
    td = {"type": "server_vad", "create_response": False}
    s, sent = await _session(_profile(), audio={"input": {"turn_detection": td}})
    step = 100 * BYTES_PER_MS
    for k in range(0, len(pcm), step):
        await s.handle(_append(pcm[k : k + step]))
    started = [e["audio_start_ms"] for e in sent if e["type"] == "input_audio_buffer.speech_started"]
    stopped = [e["audio_end_ms"] for e in sent if e["type"] == "input_audio_buffer.speech_stopped"]
    committed = [e["item_id"] for e in sent if e["type"] == "input_audio_buffer.committed"]
    assert _errors(sent) == [] and len(started) == len(stopped) == len(committed) == 2
    assert 1500 <= started[0] <= 2100  # the speech starts at 2 s (less the 300 ms padding)
    for item, begin, end in zip(s.conversation.items, started, stopped, strict=True):
        assert _pcm16(item) == pcm[begin * BYTES_PER_MS : end * BYTES_PER_MS]
    assert stopped[0] < (2000 + len(first) / BYTES_PER_MS) + 200  # not the 1.5 s of silence after
    assert len(s.input.buffer) <= (300 + 33) * BYTES_PER_MS


async def test_an_update_while_the_user_speaks_keeps_the_turn(two_sentences):
    """A session.update of other settings mid-speech (a voice agent setting the next answer's
    instructions) neither ends nor restarts the turn being spoken: it is committed whole, as
    without the update. New turn detection starts VAD over."""
    first, _, silence = two_sentences
    pcm = bytes(1000 * BYTES_PER_MS) + first + silence
    td = {"type": "server_vad", "create_response": False}
    step = 100 * BYTES_PER_MS

    async def spoken(update: dict | None) -> tuple[list[dict], RealtimeSession]:
        s, sent = await _session(_profile(), audio={"input": {"turn_detection": td}})
        for k in range(0, len(pcm), step):
            await s.handle(_append(pcm[k : k + step]))
            if update and k == len(pcm) // 2 // step * step:
                assert s.input.speech_start_ms is not None  # mid-speech
                await s.handle(
                    json.dumps({"type": "session.update", "session": {"type": "realtime", **update}})
                )
        return [e for e in sent if e["type"].startswith("input_audio_buffer.")], s

    plain, s_plain = await spoken(None)
    updated, s_updated = await spoken({"instructions": "Be brief.", "max_output_tokens": 24})
    assert [e["type"] for e in plain][-1] == "input_audio_buffer.committed"

    def strip(events: list[dict]) -> list[dict]:
        return [{k: v for k, v in e.items() if k not in ("event_id", "item_id")} for e in events]

    assert strip(updated) == strip(plain)
    assert _pcm16(s_updated.conversation.items[-1]) == _pcm16(s_plain.conversation.items[-1])
    # another silence duration is new turn detection: VAD starts over, the half-spoken turn with it
    restarted, _ = await spoken({"audio": {"input": {"turn_detection": {**td, "silence_duration_ms": 300}}}})
    assert [e["type"] for e in restarted].count("input_audio_buffer.speech_started") == 2


async def test_speculative_clips_are_a_prefix_of_the_committed_turn(two_sentences):
    """Prefill ahead sends the turn's whole chunks heard so far: each such request's last message is
    the start of the turn's own request's last message, clip for clip (the prefix caches hit)."""
    first, _, silence = two_sentences
    pipeline = Pipeline(_profile())
    s, sent = await _session(pipeline.profile, pipeline)
    pcm = bytes(1000 * BYTES_PER_MS) + first + silence
    step = 100 * BYTES_PER_MS
    for k in range(0, len(pcm), step):
        await s.handle(_append(pcm[k : k + step]))
        if s.input.ahead is not None:
            await s.input.ahead  # one at a time, as its speed allows
    await s.response.task
    assert _errors(sent) == [] and pipeline.ahead
    turn = list(pipeline.prepared[-1].request.messages[-1].parts)
    assert len(turn) >= 3  # a turn of 3 s and more: whole 1 s chunks and the rest
    for req in pipeline.ahead:
        clips = list(req.messages[-1].parts)
        assert all(a is b for a, b in zip(clips, turn, strict=False))  # the same clips: encoded once
        assert len(clips) <= len(turn)


# ---- the conversation window -----------------------------------------------------------------------


async def _turns(s: RealtimeSession, n: int, seconds: float = 0.5) -> list[int]:
    """`n` manual turns (audio, commit, response); the user turns each request carried."""
    carried = []
    for _ in range(n):
        await s.handle(_append(_tone(seconds)))
        await s.handle(json.dumps({"type": "input_audio_buffer.commit"}))
        await s.handle(json.dumps({"type": "response.create"}))
        await s.response.task
        assert s.response.status == "completed"
        request = s.pipeline.prepared[-1].request
        carried.append(sum(1 for m in request.messages if m.role == "user"))
    return carried


async def test_the_oldest_turns_go_in_batches_and_their_items_and_audio_with_them():
    """tiny: at most 4 turns, ratio 0.75 — the window grows to 4, then falls back to 3; dropped
    items are gone from the conversation (their audio with them)."""
    s, sent = await _session(_profile(), audio={"input": {"turn_detection": None}})
    first_user = None
    carried = []
    for _ in range(10):
        carried += await _turns(s, 1)
        first_user = first_user or s.conversation.items[0].id
    assert carried == [1, 2, 3, 4, 3, 4, 3, 4, 3, 4]
    assert _errors(sent) == [] and s.stats.dropped == 6
    assert (
        len(s.conversation.items) == 8
        and sum(len(_pcm16(i)) for i in s.conversation.items) == 4 * 500 * BYTES_PER_MS
    )
    await s.handle(json.dumps({"type": "conversation.item.retrieve", "item_id": first_user}))
    assert _errors(sent)[-1]["code"] == "item_not_found"


async def test_media_items_bound_the_window():
    """1 s chunks: a 6.5 s turn is 7 clips; with 16 media items a request carries 2 such turns."""
    profile = _profile(max_history_turns=64)
    profile = profile.model_copy(update={"limits": profile.limits.model_copy(update={"max_media_items": 16})})
    s, sent = await _session(profile, Pipeline(profile), audio={"input": {"turn_detection": None}})
    carried = await _turns(s, 6, seconds=6.5)
    assert carried == [1, 2, 1, 2, 1, 2]  # 3 turns = 21 clips > 16; 2 = 14 > 0.75 x 16: 1 kept
    assert _errors(sent) == []
    for p in s.pipeline.prepared:
        assert sum(len(m.parts) for m in p.request.messages if m.role == "user") <= 16


async def test_the_context_length_bounds_the_window_by_measured_tokens():
    """A 700-token context with a 200-word system prompt: turns are dropped before the request
    would be refused, from the tokens measured in the earlier prompts (no refusal at all)."""
    profile = _profile(max_history_turns=64)
    profile = profile.model_copy(update={"engine": profile.engine.model_copy(update={"max_model_len": 700})})
    pipeline = Pipeline(profile)
    words = " ".join(f"w{i}" for i in range(200))
    s, sent = await _session(
        profile, pipeline, instructions=words, max_output_tokens=16, audio={"input": {"turn_detection": None}}
    )
    carried = await _turns(s, 15, seconds=2.0)
    assert _errors(sent) == [] and pipeline.refused == 0
    assert max(carried) >= 5 and min(carried[5:]) >= 3  # a window of several turns, not one
    assert all(p.prompt_tokens + 16 <= 700 for p in pipeline.prepared)
    assert max(p.prompt_tokens for p in pipeline.prepared) > 0.9 * (700 - 16)  # the room is used


async def test_a_context_refusal_drops_a_turn_and_retries():
    """When the estimate falls short (here: new, longer instructions), the refused request is sent
    again with one turn less until it fits; the client sees a response, not an error."""
    profile = _profile(max_history_turns=64)
    profile = profile.model_copy(update={"engine": profile.engine.model_copy(update={"max_model_len": 700})})
    pipeline = Pipeline(profile)
    s, sent = await _session(
        profile, pipeline, max_output_tokens=16, audio={"input": {"turn_detection": None}}
    )
    await _turns(s, 6, seconds=2.0)
    words = " ".join(f"w{i}" for i in range(400))
    await s.handle(
        json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": words}})
    )
    await _turns(s, 1, seconds=2.0)
    assert pipeline.refused >= 1 and _errors(sent) == []
    assert pipeline.prepared[-1].prompt_tokens + 16 <= 700


async def test_a_response_asking_for_more_than_the_cap_is_refused_before_the_window_is_cut():
    """A `max_output_tokens` over the profile's cap would leave the window no room (every turn but
    the newest dropped, for good) before the pipeline refused it: it is refused first."""
    profile = _profile(max_history_turns=64)
    s, sent = await _session(profile, audio={"input": {"turn_detection": None}})
    await _turns(s, 3)
    items = [i.id for i in s.conversation.items]
    cap = profile.limits.max_tokens_cap
    await s.handle(json.dumps({"type": "response.create", "response": {"max_output_tokens": cap + 1}}))
    assert _errors(sent)[-1]["message"] == f"max_output_tokens must be at most {cap}"
    assert [i.id for i in s.conversation.items] == items and not s.busy  # the conversation is as it was


async def test_session_settings_do_not_grow_past_their_bound():
    """Unknown keys are kept and echoed (as OpenAI's are), so updates could pile them up without end:
    an update that would take the settings past MAX_SESSION_BYTES applies nothing."""
    s, sent = await _session(_profile())
    half = "x" * (ev.MAX_SESSION_BYTES // 2)
    await s.handle(json.dumps({"type": "session.update", "session": {"type": "realtime", "junk1": half}}))
    assert not _errors(sent)
    update = {"type": "realtime", "junk2": half, "instructions": "be brief"}
    await s.handle(json.dumps({"type": "session.update", "session": update}))
    assert _errors(sent)[-1]["param"] == "session" and sent[-1]["type"] == "session.updated"
    settings = s.config.model_dump()
    assert "junk1" in settings and "junk2" not in settings and s.config.instructions != "be brief"


async def test_items_created_between_responses_stay_within_the_window():
    """tiny: at most 4 turns (ratio 0.75): a client that only creates items keeps a window of them,
    as a response would, not a conversation that grows with every create."""
    s, sent = await _session(_profile())
    for i in range(40):
        await s.handle(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"note {i}"}]}}))  # fmt: skip
    assert not _errors(sent) and 3 <= len(s.conversation.items) <= 4
    assert s.conversation.items[-1].text == "note 39"  # the newest kept
