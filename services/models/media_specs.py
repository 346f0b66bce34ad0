"""The profile's media sections: the router's tile policy, the encoder pool, the video pre-stage
(services/models/profile.py composes them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TilingSpec(Strict):
    """The router's tile policy for this profile's vision encoder (services/router/tiles.py)."""

    tile_px: int = Field(default=448, ge=16)
    max_tiles: int = Field(default=40, ge=1, le=40)
    # Encoder compute per tile, for the encoder_gflops quota.
    gflops_per_tile: float = Field(default=1.0, ge=0)
    # Under overload — the encoder queue wait the gateway sees past this (services/router/
    # encoder_load.py) — requests below the realtime SLO class get at most `overload_max_tiles`
    # per image until it drains (response header x-omniray-tile-policy: reduced). None: never.
    overload_wait_s: float | None = Field(default=None, gt=0)
    overload_max_tiles: int = Field(default=4, ge=1, le=40)


class EncoderPoolSpec(Strict):
    """Tile batching and the feature cache of each encoder replica (services/stages/encoder.py)."""

    batch_size: int = Field(default=16, ge=1)
    # "fewest_pending" (small requests first, with aging) or "fifo" (arrival order; the baseline).
    policy: Literal["fewest_pending", "fifo"] = "fewest_pending"
    # How fast a waiting request's priority grows, in tiles per second of waiting.
    aging_tiles_per_s: float = Field(default=50.0, ge=0)
    cache_mib: int = Field(default=256, ge=0)
    # Images' features go to the thinker over NIXL as each is encoded, the prompt sent as soon as
    # they are placed (docs/video.md): each encoder replica writes them into a feature pool of this
    # size, the thinker's EC connector reads them. For a thinker that places media itself
    # (Qwen3-Omni). 0: off — features go whole, through Ray's object store, once all are encoded.
    stream_mib: int = Field(default=0, ge=0)
    # A prompt waits at most this long for a streamed image's features (then fails: 503).
    stream_wait_s: float = Field(default=60.0, gt=0)
    # A written item is kept at least this long (longer than stream_wait_s: never evicted while a
    # thinker may still wait for it), and indexed this long.
    stream_hold_s: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _hold_outlasts_wait(self) -> EncoderPoolSpec:
        if self.stream_hold_s <= self.stream_wait_s:
            raise ValueError("encoder_pool.stream_hold_s must exceed stream_wait_s")
        return self


class VideoSpec(Strict):
    """The video pre-stage (services/stages/video.py): how a clip becomes the key frames the encoder
    pool sees (docs/video.md)."""

    # Frames taken per second of the clip, at most `max_frames` per clip (spread evenly over a
    # longer clip).
    fps: float = Field(default=2.0, gt=0, le=30)
    max_frames: int = Field(default=32, ge=1, le=512)
    # A sampled frame is dropped as a near-duplicate of the last kept one when their 32x32 grey
    # thumbnails differ by less than this (mean absolute difference, 0-1); 0 keeps every frame.
    keyframe_threshold: float = Field(default=0.02, ge=0, le=1)
    # Frames reach the encoder with the long side at most this, both sides multiples of
    # `frame_multiple` (the vision encoder's patch grid).
    frame_px: int = Field(default=448, ge=16)
    frame_multiple: int = Field(default=32, ge=1)
