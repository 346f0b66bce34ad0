"""Stage planning: what a request is (its class), how urgent (its SLO class), what it costs, and
which stages it needs — from what it carries and what it asks for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    tiles: int = 0  # of images, document pages and video key frames
    audio_seconds: float = 0.0
    video_seconds: float = 0.0
    n_videos: int = 0
    pdf_pages: int = 0

    @property
    def encode(self) -> bool:
        return self.n_images + self.n_audio + self.n_videos > 0

    @property
    def pages(self) -> int:
        """Document pages: a PDF's, or the images of a many-image request."""
        if self.request_class != "document":
            return 0
        return self.pdf_pages or self.n_images


def plan(
    speak: bool,
    image_tiles: list[int],
    audio_seconds: list[float],
    video: list[tuple[float, int]] = (),
    pdf_pages: int = 0,
) -> StagePlan:
    """From what a request carries (the tiles of each image, a PDF's pages among them; the length
    of each audio clip; each video clip's length and the key frames it may yield, one tile each)
    and whether it asks for speech. Classification is total: every request gets exactly one class.
    A clip is vision chat ("image") unless audio makes it "audio"."""
    if audio_seconds or speak:
        cls: RequestClass = "audio"
    elif pdf_pages or len(image_tiles) >= DOCUMENT_MIN_IMAGES:
        cls = "document"
    elif image_tiles or video:
        cls = "image"
    else:
        cls = "text"
    return StagePlan(
        request_class=cls,
        n_images=len(image_tiles),
        n_audio=len(audio_seconds),
        speak=speak,
        tiles=sum(image_tiles) + sum(frames for _, frames in video),
        audio_seconds=sum(audio_seconds),
        video_seconds=sum(seconds for seconds, _ in video),
        n_videos=len(video),
        pdf_pages=pdf_pages,
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
