"""Tile policy: total, bounded, monotone in resolution, and `low` is always one tile."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.router.tiles import MAX_TILES, tile_grid

sizes = st.integers(1, 8000)


@given(sizes, sizes, st.sampled_from(["low", "high", "auto"]), st.sampled_from([128, 224, 448, 512]))
def test_grid_is_bounded_and_covers_the_resized_image(w, h, detail, tile):
    g = tile_grid(w, h, detail, tile)
    assert 1 <= g.tiles <= MAX_TILES
    assert (g.width, g.height) == (g.cols * tile, g.rows * tile)
    assert len(g.boxes()) == g.tiles
    if detail == "low":
        assert g.tiles == 1
    if detail == "high" and not g.downsampled:
        assert g.cols * tile >= w and g.rows * tile >= h


@given(st.integers(1, 2000), st.integers(1, 2000), st.integers(1, 4))
def test_more_pixels_never_fewer_tiles(w, h, k):
    # Same aspect ratio, k times the side: at least as many tiles (downsampling keeps the most that fit).
    assert tile_grid(w * k, h * k, "high", 256).tiles >= tile_grid(w, h, "high", 256).tiles


def test_examples():
    assert tile_grid(100, 100, "auto", 128).tiles == 1
    assert tile_grid(1024, 512, "auto", 512).tiles == 2
    doc = tile_grid(8000, 8000, "high", 128)
    assert doc.tiles <= 40 and doc.downsampled
    with pytest.raises(ValueError):
        tile_grid(10, 10, "ultra", 128)
