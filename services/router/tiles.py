"""Tile policy: how many encoder tiles an image costs and how it is cut.

`detail` follows OpenAI's image parameter: `low` is one tile of the whole image; `high` keeps the
resolution, cut into tiles of the encoder's size, downsampled (never rejected) until it fits in
`max_tiles`; `auto` is `low` for images no larger than one tile, else `high`. The hard limits
(bytes, pixels per side) are checked before this, by the gateway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

# Bump when the rules below change: it is part of the encoder feature-cache key.
TILE_POLICY_VERSION = "tiles-1"
MAX_TILES = 40

Detail = Literal["low", "high", "auto"]


@dataclass(frozen=True)
class TileGrid:
    cols: int
    rows: int
    tile_px: int
    # The size the image is resized to before cutting: (cols * tile_px, rows * tile_px).
    width: int
    height: int
    downsampled: bool

    @property
    def tiles(self) -> int:
        return self.cols * self.rows

    def boxes(self) -> list[tuple[int, int, int, int]]:
        t = self.tile_px
        return [(c * t, r * t, (c + 1) * t, (r + 1) * t) for r in range(self.rows) for c in range(self.cols)]


def tile_grid(width: int, height: int, detail: str, tile_px: int, max_tiles: int = MAX_TILES) -> TileGrid:
    if width < 1 or height < 1:
        raise ValueError(f"image size {width}x{height}")
    if detail not in ("low", "high", "auto"):
        raise ValueError(f"detail must be low, high or auto, not {detail!r}")
    max_tiles = max(1, max_tiles)
    if detail == "low" or max_tiles == 1 or (detail == "auto" and max(width, height) <= tile_px):
        return TileGrid(1, 1, tile_px, tile_px, tile_px, downsampled=max(width, height) > tile_px)

    def grid(scale: float) -> tuple[int, int]:
        return max(1, math.ceil(width * scale / tile_px)), max(1, math.ceil(height * scale / tile_px))

    cols, rows = grid(1.0)
    scale = 1.0
    if cols * rows > max_tiles:
        # The largest scale whose grid fits (tiles grow with scale, so bisect).
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if math.prod(grid(mid)) <= max_tiles else (lo, mid)
        scale = lo
        cols, rows = grid(scale)
    return TileGrid(cols, rows, tile_px, cols * tile_px, rows * tile_px, downsampled=scale < 1.0)
