"""Talker and vocoder stages: text -> speech units -> PCM, chunk by chunk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
from omni.v1 import stages_pb2
from ray import serve

from services.common import tensors
from services.stages._stage import Stage

_DONE = object()


@serve.deployment
class Talker(Stage):
    name = "talker"

    def __init__(self, profile: str):
        super().__init__(profile)
        self.model = self.load_model(self.profile.models.talker)

    async def Talk(self, request: stages_pb2.TalkRequest) -> AsyncIterator[stages_pb2.UnitChunk]:
        with self.operation("talk", request.ctx, chunk_index=request.chunk_index):
            units = self.model.stream_units(
                request.text, request.voice or self.profile.pipeline.default_voice
            )
            # The model is synchronous; step it off the event loop so other requests interleave.
            while (chunk := await asyncio.to_thread(next, units, _DONE)) is not _DONE:
                yield stages_pb2.UnitChunk(units=tensors.describe(chunk, producer_version=self.model.version))
            yield stages_pb2.UnitChunk(is_final=True)


@serve.deployment
class Vocoder(Stage):
    name = "vocoder"

    def __init__(self, profile: str):
        super().__init__(profile)
        self.model = self.load_model(self.profile.models.vocoder)

    async def Vocode(self, request: stages_pb2.VocodeRequest) -> stages_pb2.AudioChunk:
        with self.operation("vocode", request.ctx):
            units = tensors.materialize(request.units)
            left, right = (
                tensors.materialize(getattr(request, f)) if request.HasField(f) else None
                for f in ("left_context", "right_context")
            )
            wave = await asyncio.to_thread(self.model.decode, units, left, right, request.voice)
            pcm16 = (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
            return stages_pb2.AudioChunk(pcm16=pcm16, sample_rate=self.model.sample_rate)
