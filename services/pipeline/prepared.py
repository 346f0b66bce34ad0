"""A request once prepared (validated, admitted, its prompt built), and the quota settled at its end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from omni.v1 import common_pb2, stages_pb2

from services.pipeline.prompt import Layout
from services.pipeline.resampler import StreamResampler
from services.pipeline.turn import Turn
from services.quota.service import Cost, Lease, QuotaService
from services.router.plan import StagePlan
from services.router.tiles import TileGrid


@dataclass
class Prepared:
    turn: Turn
    ctx: common_pb2.RequestContext
    plan: StagePlan
    grids: list[TileGrid | None]  # per media item: the image's tile grid (None for audio)
    sampling: common_pb2.SamplingParams
    voice: str
    audio_format: str
    lease: Lease
    layout: Layout
    # The encoder pool was overloaded: the images were cut by the overload tile policy
    # (profile tiling.overload_max_tiles), said in a response header.
    tiles_reduced: bool = False
    # Built in prepare(), except for documents: their encoding runs inside generate() so that
    # progress events stream to the client while the tiles are encoded.
    prompt: stages_pb2.Prompt | None = None
    prompt_tokens: int = 0
    # The response's speech to OUTPUT_RATE (made at its first audio: the vocoder says its rate).
    resampler: StreamResampler | None = None
    audio_prompt_tokens: int = 0  # of prompt_tokens: the request's audio (usage details)
    # Images streamed to the thinker (profile encoder_pool.stream_mib): the prompt was built from
    # their placements; this is the rest of their encoding, which fails the response if it fails.
    encoding: asyncio.Task | None = None

    @property
    def headers(self) -> dict[str, str]:
        """The response's headers: the quota's (x-ratelimit-*), and the tile policy when reduced."""
        if not self.tiles_reduced:
            return self.lease.headers
        return {**self.lease.headers, TILE_POLICY_HEADER: "reduced"}


TILE_POLICY_HEADER = "x-omniray-tile-policy"


class Settlement:
    """Gives back what a request was admitted for and did not use."""

    def __init__(self, quota: QuotaService):
        self.quota = quota
        self._releasing: set[asyncio.Task] = set()  # releases that outlive their request

    async def release(self, lease: Lease, used: Cost) -> None:
        """The quota keeps `used`. Its own task, awaited through a shield: a client that left
        cancels the response's generator and every await in it, but not the release."""
        release = asyncio.create_task(self.quota.release(lease, used))
        self._releasing.add(release)
        release.add_done_callback(self._releasing.discard)
        await asyncio.shield(release)
