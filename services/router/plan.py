"""Stage planning: what a request is (its class), how urgent (its SLO class), what it costs, and
which stages it needs — from what it carries and what it asks for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omni.v1 import omni_pb2, stages_pb2

from services.quota.tenants import SLO_CLASSES, SloClass, TenantSpec

RequestClass = Literal["text", "image", "document", "audio"]
# More images than this in one request make it a document (many pages) rather than image chat.
DOCUMENT_MIN_IMAGES = 4
_SERVICE_TIERS = {"flex": "batch", "priority": "realtime"}


@dataclass(frozen=True)
class StagePlan:
    request_class: RequestClass
    n_images: int
    n_audio: int
    speak: bool  # talker + vocoder
    tiles: int = 0
    audio_seconds: float = 0.0

    @property
    def encode(self) -> bool:
        return self.n_images + self.n_audio > 0

    @property
    def pages(self) -> int:
        return self.n_images if self.request_class == "document" else 0


def plan(request: omni_pb2.ChatRequest, items: list[stages_pb2.MediaItem]) -> StagePlan:
    """Classification is total: every request gets exactly one class."""
    images = [i for i in items if i.modality == "image"]
    audio = [i for i in items if i.modality == "audio"]
    if audio or "audio" in request.modalities:
        cls: RequestClass = "audio"
    elif len(images) >= DOCUMENT_MIN_IMAGES:
        cls = "document"
    elif images:
        cls = "image"
    else:
        cls = "text"
    return StagePlan(
        request_class=cls,
        n_images=len(images),
        n_audio=len(audio),
        speak="audio" in request.modalities,
        tiles=sum(i.tiles.cols * i.tiles.rows for i in images),
        audio_seconds=sum(i.audio_seconds for i in audio),
    )


def slo_class(tenant: TenantSpec, requested: str = "", service_tier: str = "") -> SloClass:
    """The class asked for (explicitly, or through OpenAI's service_tier), never above the
    tenant's max_class; the tenant's default when nothing is asked."""
    asked = requested or _SERVICE_TIERS.get(service_tier, "")
    if not asked:
        return tenant.default_class
    if asked not in SLO_CLASSES:
        from services.common.errors import bad_request

        raise bad_request(f"unknown SLO class {asked!r}; one of {list(SLO_CLASSES)}", param="slo_class")
    return max(asked, tenant.max_class, key=SLO_CLASSES.index)  # a later index is a lower class
