"""A realtime session's camera: frames the client shows while it speaks (WebSocket
`input_image_buffer.append`, or a WebRTC video track), of which a bounded window of recent key frames
joins the next committed turn — what the user showed while speaking, in time order — and is then
cleared.

Bounded per session (profile `realtime.camera`): frames faster than `max_fps` are dropped on
arrival, near-duplicates of the last kept frame are dropped (services/policies/frames/keyframes.py:
a static camera holds one frame, not one per second), and at most `window_frames` are held (the
oldest go first). Held frames are images like any `input_image`: counted in the conversation window
(media items) and billed as image tiles when a response carries them."""

from __future__ import annotations

import asyncio
import hashlib
import time

import numpy as np

from services.extensions.ray.metrics import metric
from services.models.profile import Profile
from services.pipeline import media
from services.pipeline.turn import ImageInput
from services.policies.frames.keyframes import KeyFrames
from services.realtime import events as ev

OUTCOMES = ("held", "rate_dropped", "duplicate", "evicted", "joined")


class Camera:
    def __init__(self, profile: Profile, clock=time.monotonic):
        self.spec, self.limits, self.clock = profile.realtime.camera, profile.limits, clock
        self.takes_images = profile.models.vision is not None
        self.keys = KeyFrames(self.spec.keyframe_threshold)
        self.held: list[ImageInput] = []
        self._last_at: float | None = None
        self.frames = metric("omniray_realtime_camera_frames_total", outcome=OUTCOMES)

    def due(self) -> bool:
        """Whether a frame arriving now is within the frame rate (checked before it is decoded)."""
        now = self.clock()
        if self._last_at is not None and now - self._last_at < 1.0 / self.spec.max_fps:
            self.frames.inc(tags={"outcome": "rate_dropped"})
            return False
        self._last_at = now
        return True

    async def show(self, image_url: str, event_id: str | None) -> None:
        """A frame over the protocol (`input_image_buffer.append`): checked as any `input_image`
        (header first), decoded only when within the frame rate."""
        if not self.takes_images:
            raise ev.RealtimeEventError(
                "this model does not take images", code="invalid_value", event_id=event_id
            )
        data = media.data_url_bytes(image_url, param="image_url", limit=self.limits.max_image_bytes)
        image = media.image_input(data, "auto", self.limits, param="image_url")
        if self.due():
            self.offer(await asyncio.to_thread(image.pixels))

    def offer(self, pixels: np.ndarray) -> bool:
        """A frame (uint8 RGB [h, w, 3]) shown now, `due`; whether it is held (a model without a
        vision encoder holds none)."""
        if not self.takes_images or not self.keys.offer(pixels):
            self.frames.inc(tags={"outcome": "duplicate"})
            return False
        height, width = pixels.shape[:2]
        self.held.append(
            ImageInput(
                width=width,
                height=height,
                detail="auto",
                content_hash=hashlib.sha256(pixels.tobytes()).hexdigest(),
                decode=lambda: pixels,
            )
        )
        self.frames.inc(tags={"outcome": "held"})
        if len(self.held) > self.spec.window_frames:
            del self.held[0]
            self.frames.inc(tags={"outcome": "evicted"})
        return True

    def take(self) -> list[ImageInput]:
        """The held frames, for the turn being committed; the window starts over (the next turn's
        first frame is kept whatever it looks like)."""
        taken, self.held = self.held, []
        self.keys = KeyFrames(self.spec.keyframe_threshold)
        if taken:
            self.frames.inc(len(taken), tags={"outcome": "joined"})
        return taken
