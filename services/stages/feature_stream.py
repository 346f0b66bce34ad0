"""A stream request's images in the encoder pool (services/stages/encoder.py): placed before they are
encoded, each written to the replica's NIXL feature pool (kv_store/features.py) as soon as it is, where
the thinker's EC connector reads it (services/extensions/vllm/ec_connector.py)."""

from __future__ import annotations

import asyncio

import numpy as np

from kv_store.features import PAGE_BYTES, FeaturePool, pages_for
from services.models.base import Placement


class FeatureStream:
    """A stream request's images: placed before they are encoded, each written to the replica's
    feature pool as soon as it is (the thinker's EC connector reads them over NIXL). Off when the
    pool has no room for them all: they then go whole, in the result."""

    def __init__(self, pool: FeaturePool, metrics):
        self.pool, self.metrics = pool, metrics
        self.placed: dict[int, tuple[Placement, tuple[int, ...]]] = {}
        self.keys: dict[int, str] = {}
        self.ready = asyncio.Event()
        self.on = False

    def place(self, placed: dict[int, tuple[Placement, tuple[int, ...]]], keys: dict[int, str]) -> None:
        need = sum(pages_for(int(np.prod(shape)) * 4) * PAGE_BYTES for _, shape in placed.values())
        self.on = self.pool.fits(need)
        self.placed, self.keys = placed, keys
        if not self.on:
            self.metrics.streamed("refused", len(placed))
        self.ready.set()

    async def write(self, i: int, features: np.ndarray) -> None:
        if not self.on:
            return
        if not await asyncio.to_thread(self.pool.put, self.keys[i], features):
            # Others filled the pool since this request was placed: its prompt waits for an image
            # that will not come — fail it now rather than at the thinker's wait bound.
            raise RuntimeError("the encoder's feature pool has no room for a placed image")
        self.pool.expect_readers()
        self.metrics.streamed("written", 1, self.pool.stats["held_bytes"])
