"""Stage planning: which stages a request needs, from what it carries and what it asks for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omni.v1 import omni_pb2

RequestClass = Literal["text", "image", "document", "audio"]
# More images than this in one request make it a document (many pages) rather than image chat.
DOCUMENT_MIN_IMAGES = 4


@dataclass(frozen=True)
class StagePlan:
    request_class: RequestClass
    n_images: int
    n_audio: int
    speak: bool  # talker + vocoder

    @property
    def encode(self) -> bool:
        return self.n_images + self.n_audio > 0


def plan(request: omni_pb2.ChatRequest) -> StagePlan:
    n_images = n_audio = 0
    for m in request.messages:
        for part in m.content:
            kind = part.WhichOneof("part")
            n_images += kind == "image"
            n_audio += kind == "audio"
    if n_audio:
        cls: RequestClass = "audio"
    elif n_images >= DOCUMENT_MIN_IMAGES:
        cls = "document"
    elif n_images:
        cls = "image"
    else:
        cls = "text"
    return StagePlan(
        request_class=cls, n_images=n_images, n_audio=n_audio, speak="audio" in request.modalities
    )
