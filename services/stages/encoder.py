"""Encoder pool stage: images and audio -> what the thinker sees (embeddings or text)."""

from __future__ import annotations

import asyncio
import io

from omni.v1 import stages_pb2
from PIL import Image
from ray import serve

from services.common import tensors
from services.models.base import EncoderOutput
from services.stages._stage import Stage


@serve.deployment
class Encoder(Stage):
    name = "encoder"

    def __init__(self, profile: str):
        super().__init__(profile)
        self.vision = self.load_model(self.profile.models.vision)
        self.audio = self.load_model(self.profile.models.audio)

    def _encode(self, items: list[stages_pb2.MediaItem]) -> list[tuple[EncoderOutput, str, str]]:
        images, waves = [], []
        for i, item in enumerate(items):
            data = tensors.materialize(item.data)
            if item.modality == "image":
                if self.vision is None:
                    raise ValueError("this profile has no vision encoder")
                images.append((i, Image.open(io.BytesIO(data.tobytes())).convert("RGB")))
            elif item.modality == "audio":
                if self.audio is None:
                    raise ValueError("this profile has no audio encoder")
                waves.append((i, data.view("float32")))
            else:
                raise ValueError(f"unknown modality {item.modality!r}")
        results: list = [None] * len(items)
        if images:
            for (i, _), out in zip(images, self.vision.encode([im for _, im in images]), strict=True):
                results[i] = (out, self.vision.version, items[i].data.content_hash)
        if waves:
            for (i, _), out in zip(waves, self.audio.encode([w for _, w in waves]), strict=True):
                results[i] = (out, self.audio.version, items[i].data.content_hash)
        return results

    async def Encode(self, request: stages_pb2.EncodeRequest) -> stages_pb2.EncodeResponse:
        with self.operation("encode", request.ctx, items=len(request.items)):
            results = await asyncio.to_thread(self._encode, list(request.items))
            response = stages_pb2.EncodeResponse()
            for out, version, content_hash in results:
                item = response.items.add(
                    encoder_version=version, tiles=out.tiles, audio_seconds=out.audio_seconds
                )
                if out.embeddings is not None:
                    item.embeddings.CopyFrom(
                        tensors.describe(out.embeddings, content_hash=content_hash, producer_version=version)
                    )
                else:
                    item.text = out.text or ""
            return response
