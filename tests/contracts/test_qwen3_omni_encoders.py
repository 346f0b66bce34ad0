"""Qwen3-Omni's own encoders in the encoder pool feed vLLM's thinker exactly what it computes itself:
for an image + audio prompt, the greedy tokens are the same whether the thinker encodes the raw media
or takes the adapters' outputs (deepstack rows, image grid, audio mel frames) as its multimodal
inputs, placed and positioned (M-RoPE) by vLLM; and the rows vLLM's workers write for the talker are
transformers' hidden states at the talker's layer. Runs on `qwen3-omni-tiny` (make models)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from services.common.paths import REPO_ROOT
from services.models.profile import load_profile
from services.models.registry import adapter_module


@pytest.fixture(scope="module")
def profile():
    profile = load_profile("qwen3-omni-tiny")
    if not (profile.model_path(profile.models.thinker) / "model.safetensors").is_file():
        pytest.fail("qwen3-omni-tiny not built: make models PROFILE=qwen3-omni-tiny")
    return profile


@pytest.fixture(scope="module")
def vision(profile):
    return adapter_module("qwen3_omni_vision").load(
        profile.model_path(profile.models.vision), profile.models.vision.options
    )


def test_greedy_tokens_are_the_same_from_the_encoder_pool_as_from_raw_media(profile, redis_url):
    env = {**os.environ, "OMNIRAY_REDIS_URL": redis_url}
    run = subprocess.run([sys.executable, "-m", "tests.contracts.qwen3_omni_media"], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=900, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    runs = {
        r["name"]: r for r in (json.loads(x[4:]) for x in run.stdout.splitlines() if x.startswith("RUN "))
    }
    raw, pool, tiles = runs["raw"], runs["encoder_pool"], runs["two_tiles"]
    assert len(raw["tokens"]) == 16 and pool["tokens"] == raw["tokens"]
    # The engine counts what vLLM expands: one placeholder per embedding row.
    assert pool["prompt_tokens"] == raw["prompt_tokens"] == pool["counted"]
    # A 2x1 grid is one image of twice the tokens, laid out across both tiles.
    assert tiles["prompt_tokens"] == tiles["counted"] == pool["counted"] - 130 + 2 * 196
    # The workers wrote the thinker's rows at the media placeholders for the talker: transformers'
    # hidden states after accept_hidden_layer layers at the same positions.
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("ROWS ")]
    rows = json.loads(line[5:])
    assert rows["items"] == 2 and rows["rows"] == 130 + 18
    assert rows["max_abs"] <= 1e-3 * max(1.0, rows["scale"]), rows


def test_streamed_features_give_the_same_greedy_tokens_and_a_missing_one_fails_alone(profile, redis_url):
    """Images' features streamed over NIXL to vLLM's EC connector (services/extensions/vllm/
    ec_connector.py) while the request waits: the tokens of the features inline; an image never
    written fails its request at the wait bound, and the engine serves the next one."""
    env = {**os.environ, "OMNIRAY_REDIS_URL": redis_url}
    run = subprocess.run([sys.executable, "-m", "tests.contracts.qwen3_omni_streamed"], capture_output=True,
                         text=True, cwd=REPO_ROOT, timeout=900, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    runs = {
        r["name"]: r for r in (json.loads(x[4:]) for x in run.stdout.splitlines() if x.startswith("RUN "))
    }
    whole, streamed = runs["whole"], runs["streamed"]
    assert len(whole["tokens"]) == 12 and streamed["tokens"] == whole["tokens"]
    # It waited for its last image (written 3 x 0.6 s after the request), not failed nor ran without it.
    assert streamed["written_before_done"] == 3 and streamed["seconds"] >= 1.8
    assert runs["streamed_again"]["tokens"] == whole["tokens"]
    assert runs["never_written"]["finish"] not in ("stop", "length") and runs["never_written"]["seconds"] >= 3
    assert runs["after_failure"]["tokens"] == whole["tokens"]


def test_greedy_tokens_of_a_clip_are_the_thinker_reading_its_frames(profile):
    """A clip's key frames through the encoder pool (temporal patches of 2 frames, placed as the
    model's video input with its seconds per patch) give vLLM's thinker the greedy tokens
    transformers' thinker writes reading the frames itself; and those depend on the time axis."""
    run = subprocess.run([sys.executable, "-m", "tests.contracts.qwen3_omni_video"], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    runs = {
        r["name"]: r for r in (json.loads(x[4:]) for x in run.stdout.splitlines() if x.startswith("RUN "))
    }
    raw, pool, slower = runs["transformers"], runs["encoder_pool"], runs["transformers_slower"]
    assert len(raw["tokens"]) == 16 and pool["tokens"] == raw["tokens"]
    assert pool["prompt_tokens"] == raw["prompt_tokens"] == pool["counted"]
    assert pool["seconds_per_grid"] == 1.0  # key frames 0.5 s apart, 2 a temporal patch
    assert slower["tokens"] != raw["tokens"]


def test_video_tiles_are_temporal_patches_on_the_patch_grid(vision):
    frames = np.zeros((2, 64, 96, 3), np.uint8)
    tile = vision.video_tile(frames)
    assert tile.grid_thw == (1, 4, 6) and tile.pixel_values.shape == (24, 3 * 2 * 16 * 16)
    with pytest.raises(ValueError, match="patch grid"):
        vision.video_tile(np.zeros((2, 50, 96, 3), np.uint8))


def test_a_whole_image_gets_at_most_a_tiles_pixels_and_keeps_its_aspect(vision):
    big = vision.preprocess(Image.new("RGB", (1600, 900)))
    t, h, w = big.grid_thw
    assert h * w * 16 * 16 <= 448 * 448 and w > h  # landscape stays landscape
    small = vision.preprocess(Image.new("RGB", (320, 416)))
    assert small.grid_thw == (1, 26, 20)  # the processor's own size, no upscaling to a tile


def test_tiles_are_laid_out_in_the_whole_images_raster_order(vision):
    rng = np.random.default_rng(1)
    tiles = [
        vision.preprocess(Image.fromarray((rng.random((448, 448, 3)) * 255).astype(np.uint8)))
        for _ in range(6)
    ]
    feats = vision.encode_tiles(tiles)
    out = vision.assemble(feats, 3, 2)
    assert out.placement.grid_thw == (1, 2 * 28, 3 * 28) and out.tiles == 6
    grid = out.embeddings.reshape(2 * 14, 3 * 14, -1)  # merged tokens: 14 x 14 per tile
    for k, f in enumerate(feats):
        r, c = divmod(k, 3)
        np.testing.assert_array_equal(
            grid[r * 14 : (r + 1) * 14, c * 14 : (c + 1) * 14].reshape(196, -1), f.rows
        )
    # deepstack rows beside the merger's: hidden x (1 + levels)
    assert out.embeddings.shape[1] == 64 * (1 + 3)
    # batching does not change a tile's features
    np.testing.assert_allclose(vision.encode_tiles(tiles[:1])[0].rows, feats[0].rows, atol=1e-5)
