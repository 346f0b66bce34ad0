"""Tile-level scheduling for the encoder pool: the tile is the unit of work, and tiles of different
requests share a batch.

Order: the request with the fewest pending tiles first, so single-image chat is not stuck behind a
500-tile document; aging lowers a waiting request's score by `aging_tiles_per_s` per second, so a
large request is never starved. `fifo` (arrival order) is the baseline the benchmark compares with.
A request's tiles are one `TileJob` (the encoder stage's: its images' features as they complete).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from omni.v1 import common_pb2

Policy = Literal["fewest_pending", "fifo"]


@dataclass
class _Job:
    key: Any
    arrival: float
    seq: int
    tiles: deque = field(default_factory=deque)


class TileScheduler:
    def __init__(
        self,
        batch_size: int,
        policy: Policy = "fewest_pending",
        aging_tiles_per_s: float = 50.0,
        clock=time.monotonic,
    ):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.batch_size, self.policy, self.aging, self.clock = batch_size, policy, aging_tiles_per_s, clock
        self._jobs: dict[Any, _Job] = {}
        self._seq = 0

    def submit(self, key: Any, tiles: list) -> None:
        """Queue a request's tiles (in order) under a unique key."""
        if key in self._jobs:
            raise KeyError(f"{key!r} is already queued")
        if tiles:
            self._seq += 1
            self._jobs[key] = _Job(key, self.clock(), self._seq, deque(tiles))

    def cancel(self, key: Any) -> None:
        self._jobs.pop(key, None)

    @property
    def pending(self) -> int:
        return sum(len(j.tiles) for j in self._jobs.values())

    def pending_for(self, key: Any) -> int:
        job = self._jobs.get(key)
        return len(job.tiles) if job else 0

    def _score(self, job: _Job, now: float) -> tuple:
        if self.policy == "fifo":
            return (job.arrival, job.seq)
        return (len(job.tiles) - self.aging * (now - job.arrival), job.seq)

    def next_batch(self) -> list[tuple[Any, Any]]:
        """Up to batch_size (key, tile) pairs, best-scored requests first."""
        now = self.clock()
        batch: list[tuple[Any, Any]] = []
        for job in sorted(self._jobs.values(), key=lambda j: self._score(j, now)):
            while job.tiles and len(batch) < self.batch_size:
                batch.append((job.key, job.tiles.popleft()))
            if not job.tiles:
                del self._jobs[job.key]
            if len(batch) == self.batch_size:
                break
        return batch


class TileJob:
    """One request's images waiting for their tile features (a request is one scheduler job, so
    its priority is its total pending tiles)."""

    def __init__(self, tiles_per_image: dict[int, int], n_images: int, progress=None, on_image=None):
        self.remaining = dict(tiles_per_image)
        self.on_image = on_image  # called with (image, its tile features) as each image completes
        self.features: dict[int, list] = {i: [] for i in tiles_per_image}
        self.done = asyncio.get_running_loop().create_future()
        self.tiles_total = sum(tiles_per_image.values())
        self.tiles_done = 0
        self.cached = n_images - len(tiles_per_image)  # images the cache answered
        self.n_images = n_images
        self.progress = progress
        self.submitted = time.monotonic()
        self.waited: float | None = None  # until its first batch

    def add(self, image: int, feature) -> None:
        self.features[image].append(feature)
        self.remaining[image] -= 1
        self.tiles_done += 1
        if self.remaining[image] == 0 and self.on_image is not None:
            self.on_image(image, self.features[image])
        if not any(self.remaining.values()) and not self.done.done():
            self.done.set_result(self.features)

    def report(self) -> None:
        """After each batch that carried this request's tiles."""
        if self.progress is not None:
            images_done = self.cached + sum(1 for n in self.remaining.values() if n == 0)
            self.progress(
                common_pb2.Progress(
                    stage="encoder",
                    tiles_done=self.tiles_done,
                    tiles_total=self.tiles_total,
                    images_done=images_done,
                    images_total=self.n_images,
                )
            )
