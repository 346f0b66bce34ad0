"""Talker and vocoder stages: text (or the thinker's tokens) -> speech units -> PCM, chunk by chunk.

A talker whose model batches its streams (a `loop`: services/models/stream_loop.py) steps every
stream of the replica in one forward; the replica's urgency policy orders the streams waiting for a
slot (the sessions closest to a playback gap first). A model step of a talker that does not batch,
and each vocoder call, waits for a slot of the replica's urgency gate (services/stages/urgency_gate.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import numpy as np
from omni.v1 import stages_pb2
from ray import serve

from services.common.redis_config import async_client, redis_url
from services.dataplane import tensors, token_stream
from services.extensions.ray.metrics import metric
from services.models.base import ThinkerPrompt, VocodeInput
from services.models.stream_loop import StepStats
from services.playback.board import BoardReader
from services.policies import urgency
from services.stages._stage import Stage
from services.stages.urgency_batcher import UrgencyBatcher
from services.stages.urgency_gate import UrgencyGate, most_urgent_first

log = logging.getLogger("ray.serve")
_DONE = object()
STREAM_ENDS = ("codec_eos", "text_budget", "max_frames", "error")  # omniray_talker_streams_total


class _SpeechStage(Stage):
    def __init__(self, profile: dict):
        super().__init__(profile)
        spec = self.profile.realtime.scheduler
        self.board = BoardReader(redis_url(), spec.board_interval_s)
        self.policy = urgency.create(spec.policy, spec.params, piece_tokens=self.profile.audio_piece_tokens())
        self.gate = UrgencyGate(self.policy, self.board.views, spec.stage_slots)
        self.waited = metric("omniray_stage_urgency_wait_seconds")
        self.step_streams = metric("omniray_stage_step_streams")
        self.step_seconds = metric("omniray_stage_step_seconds")
        self.queue_wait = metric("omniray_stage_queue_wait_seconds")
        self.active_streams = metric("omniray_stage_active_streams")

    def observe_step(self, stats: StepStats) -> None:
        tags = {"stage": self.name}
        self.step_streams.observe(stats.streams, tags=tags)
        self.step_seconds.observe(stats.seconds, tags=tags)
        for waited in stats.waited_s:
            self.queue_wait.observe(waited, tags=tags)

    @contextlib.asynccontextmanager
    async def step(self, ctx) -> AsyncIterator[None]:
        async with self.gate.step(ctx.session_id) as waited:
            self.waited.observe(waited, tags={"stage": self.name})
            yield


@serve.deployment
class Talker(_SpeechStage):
    name = "talker"

    def __init__(self, profile: dict):
        super().__init__(profile)
        self.model = self.load_model(self.profile.models.talker)
        self.redis = async_client()  # token streams (token talkers)
        # How long a token talker waits for the thinker's next token before it gives up on the
        # response: as long as a stalled or lost decode may take to go on. A response that fails
        # sooner cancels its talk (the gateway), so this bounds a talker whose gateway went away.
        self.token_wait_s = self.profile.pipeline.thinker_gap_s()
        self.frames = metric("omniray_talker_frames_total")
        self.streams = metric("omniray_talker_streams_total", end=STREAM_ENDS)
        loop = getattr(self.model, "loop", None)
        if loop is not None:  # the model batches its streams: its loop reports to this replica
            loop.order = self._most_urgent_first
            loop.on_step = self._stepped
            for state in ("stepping", "waiting"):
                self.active_streams.set(0, tags={"stage": self.name, "state": state})

    def _most_urgent_first(self, streams: list) -> list:
        """The order streams waiting for a slot get one (the loop's thread: no I/O)."""
        order = most_urgent_first(self.policy, self.board.views(), [(s.arrival, s.session) for s in streams])
        return [streams[i] for i in order]

    def _stepped(self, stats: StepStats) -> None:
        self.observe_step(stats)
        loop, tags = self.model.loop, {"stage": self.name}
        self.active_streams.set(loop.active, tags={**tags, "state": "stepping"})
        self.active_streams.set(loop.queued, tags={**tags, "state": "waiting"})

    async def Talk(self, request: stages_pb2.TalkRequest) -> AsyncIterator[stages_pb2.UnitChunk]:
        if request.HasField("thinker"):
            async for chunk in self._talk_tokens(request):
                yield chunk
            return
        with self.operation("talk", request.ctx, chunk_index=request.chunk_index):
            voice = request.voice or self.profile.pipeline.default_voice
            async for chunk in self._text_units(request.text, voice, request.ctx):
                yield stages_pb2.UnitChunk(units=tensors.describe(chunk, producer_version=self.model.version))
            yield stages_pb2.UnitChunk(is_final=True)

    async def _text_units(self, text: str, voice: str, ctx) -> AsyncIterator[np.ndarray]:
        """A text piece's unit chunks: from the model's step loop where it batches its streams, else
        one model step at a time through the urgency gate, off the event loop."""
        if getattr(self.model, "loop", None) is not None:
            stream = self.model.stream(text, voice)
            stream.session = ctx.session_id
            try:
                async for chunk in stream.aframes():
                    yield chunk
            finally:
                stream.cancel()  # a barge-in: its slot is free for the next step
            return
        units = self.model.stream_units(text, voice)
        while True:
            async with self.step(ctx):
                chunk = await asyncio.to_thread(next, units, _DONE)
            if chunk is _DONE:
                return
            yield chunk

    async def _talk_tokens(self, request: stages_pb2.TalkRequest) -> AsyncIterator[stages_pb2.UnitChunk]:
        """A token talker: the whole response in one call, reading the thinker's tokens from the
        response's token stream while it writes frames (services/models/qwen3_omni/talker.py)."""
        thinker = request.thinker
        with self.operation("talk_tokens", request.ctx):
            stream = self.model.stream(
                _thinker_prompt(thinker),
                request.voice or self.profile.pipeline.default_voice,
                seed=request.seed or None,
                stop_token_ids=thinker.stop_token_ids,
            )

            async def follow() -> None:
                try:
                    async for item in token_stream.read(thinker.token_stream, self.token_wait_s, self.redis):
                        if isinstance(item, np.ndarray):  # the thinker's rows at the media, first
                            stream.set_media_hidden(item)
                        else:
                            stream.feed(item)
                            if stream.text_ended:  # e.g. at a tool call's marker: the call is not read
                                break
                except BaseException as e:  # a stalled thinker or Redis: the talker stops with it
                    stream.finish(e)
                    raise
                stream.finish()

            reader = asyncio.create_task(follow())
            stream.session = request.ctx.session_id  # its urgency, for a slot
            sizes = iter(self.model.chunk_frames)
            size = next(sizes)
            frames_sent = 0
            batch: list[np.ndarray] = []

            def chunk() -> stages_pb2.UnitChunk:
                nonlocal frames_sent, size
                units = np.concatenate(batch)
                frames_sent += len(batch)
                self.frames.inc(len(batch))
                batch.clear()
                size = next(sizes, size)
                return stages_pb2.UnitChunk(
                    units=tensors.describe(units, producer_version=self.model.version)
                )

            try:
                async for frame in stream.aframes(timeout=self.token_wait_s):
                    batch.append(frame)
                    if len(batch) >= size:
                        yield chunk()
                if batch:
                    yield chunk()
                self.streams.inc(tags={"end": stream.ended_by or "codec_eos"})
                log.info(
                    "talker %s: %d frames, ended by %s", request.ctx.request_id, frames_sent, stream.ended_by
                )
                yield stages_pb2.UnitChunk(is_final=True, truncated=stream.ended_by == "max_frames")
            except Exception:
                self.streams.inc(tags={"end": "error"})
                raise
            finally:
                reader.cancel()
                stream.cancel()  # a barge-in or a failure: its slot is free for the next step


def _thinker_prompt(thinker: stages_pb2.ThinkerOutput) -> ThinkerPrompt:
    return ThinkerPrompt(
        token_ids=list(thinker.prompt_ids),
        media_hidden=tensors.materialize(thinker.media_hidden) if thinker.HasField("media_hidden") else None,
        image_grid_thw=[tuple(m.grid_thw) for m in thinker.media if m.modality == "image"],
        video_grid_thw=[tuple(m.grid_thw) for m in thinker.media if m.modality == "video"],
        video_seconds_per_grid=[m.seconds_per_grid for m in thinker.media if m.modality == "video"],
        audio_feature_lengths=[m.feature_frames for m in thinker.media if m.modality == "audio"],
    )


@serve.deployment
class Vocoder(_SpeechStage):
    name = "vocoder"

    def __init__(self, profile: dict):
        super().__init__(profile)
        spec = self.profile.models.vocoder
        self.model = self.load_model(spec)
        self.batcher = UrgencyBatcher(
            self.policy,
            self.board.views,
            self.model.decode_batch,
            spec.max_batch,
            self.profile.realtime.scheduler.stage_slots,
            spec.batch_wait_ms / 1000,
            self._decoded,
            VocodeInput.shape,
        )

    def _decoded(self, stats: StepStats) -> None:
        self.observe_step(stats)
        for waited in stats.waited_s:  # the urgency gate's wait, as before batching
            self.waited.observe(waited, tags={"stage": self.name})

    async def Vocode(self, request: stages_pb2.VocodeRequest) -> stages_pb2.AudioChunk:
        with self.operation("vocode", request.ctx):
            units = tensors.materialize(request.units)
            left, right = (
                tensors.materialize(getattr(request, f)) if request.HasField(f) else None
                for f in ("left_context", "right_context")
            )
            chunk = VocodeInput(units, left, right, request.voice)
            wave = await self.batcher.run(request.ctx.session_id, chunk)
            pcm16 = (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
            return stages_pb2.AudioChunk(pcm16=pcm16, sample_rate=self.model.sample_rate)
