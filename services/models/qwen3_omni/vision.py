"""Qwen3-Omni's own vision encoder as the encoder pool's vision model.

Weights: the `thinker.visual.` tensors of the model's checkpoint, loaded alone into transformers'
module. Tiles are prepared by the checkpoint's own image processor, as vLLM prepares an image when
its thinker encodes it itself, so the thinker receives the same features either way
(tests/contracts/test_qwen3_omni_encoders.py compares the greedy tokens).

A tile is a `tile_px` square (a multi-tile grid) or the whole image resized by the processor's rule
within one tile's pixels (a 1x1 grid: aspect ratio kept). Tiles of any requests are one forward pass
(attention stays within each tile). A multi-tile image is laid out as one image: tile tokens in the
whole grid's raster order, its grid the tiles' patches side by side, so M-RoPE positions run across
the whole image. Output rows: the merger's output with the deepstack mergers' outputs beside it
([tokens, hidden x (1 + levels)], as vLLM's own vision path hands them to its language model), placed
by vLLM as the model's image input (services/extensions/vllm/qwen3_omni_thinker.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.models import options as o
from services.models.base import EncoderOutput, Placement
from services.models.qwen3_omni import checkpoint


@dataclass(frozen=True)
class VisionTile:
    pixel_values: np.ndarray  # [patches, channels x temporal x patch x patch]
    grid_thw: tuple[int, int, int]  # in patches


@dataclass(frozen=True)
class TileFeatures:
    rows: np.ndarray  # [tokens, hidden x (1 + deepstack levels)]
    grid_thw: tuple[int, int, int]


class VisionEncoder:
    def __init__(self, path: Path, options: o.Qwen3OmniVision):
        from transformers import AutoConfig, AutoImageProcessor
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder

        config = AutoConfig.from_pretrained(path).thinker_config.vision_config
        self.model = checkpoint.module(
            Qwen3OmniMoeVisionEncoder, config, path, "thinker.visual.", options.dtype
        )
        self.processor = AutoImageProcessor.from_pretrained(path)
        self.merge = config.spatial_merge_size
        self.tile_px = options.tile_px
        self.prefix, self.placeholder, self.suffix = checkpoint.token_ids(
            path, "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
        )
        (self.video_placeholder,) = checkpoint.token_ids(path, "<|video_pad|>")
        self.patch, self.frames_per_tile = config.patch_size, config.temporal_patch_size
        # A feature row: the merger's output and each deepstack merger's beside it.
        self.feature_dim = config.out_hidden_size * (1 + len(config.deepstack_visual_indexes))
        self.mean = np.asarray(self.processor.image_mean, np.float32)[:, None, None]
        self.std = np.asarray(self.processor.image_std, np.float32)[:, None, None]
        self.rescale = float(self.processor.rescale_factor)
        self.version = f"qwen3-omni-vision:{path.name}"

    def preprocess(self, tile) -> VisionTile:
        # A tile's pixels at most: a 1x1 grid costs what one tile does, whatever the image's size.
        size = {"shortest_edge": self.processor.size["shortest_edge"], "longest_edge": self.tile_px**2}
        out = self.processor(images=[tile.convert("RGB")], size=size, return_tensors="np")
        return VisionTile(
            out["pixel_values"].astype(np.float32), tuple(int(x) for x in out["image_grid_thw"][0])
        )

    def encode_tiles(self, tiles: list[VisionTile]) -> list[TileFeatures]:
        import torch

        p = next(self.model.parameters())
        grid = torch.tensor([t.grid_thw for t in tiles], device=p.device)
        pixels = torch.from_numpy(np.concatenate([t.pixel_values for t in tiles])).to(p.device, p.dtype)
        with torch.inference_mode():
            out = self.model(pixels, grid_thw=grid)
            rows = torch.cat([out.pooler_output, *out.deepstack_features], dim=-1).float().cpu().numpy()
        sizes = [t * h * w // self.merge**2 for t, h, w in (x.grid_thw for x in tiles)]
        split = np.split(rows, np.cumsum(sizes)[:-1])
        return [TileFeatures(r, tile.grid_thw) for tile, r in zip(tiles, split, strict=True)]

    def placement(self, tiles: list, cols: int, rows: int) -> tuple[Placement, tuple[int, int]]:
        """An image's placement and its features' shape [tokens, dim], from its tiles' grids (its
        preprocessed tiles, or their features) — known before it is encoded, so a prompt can be
        sent while it is (services/extensions/vllm/ec_connector.py)."""
        (t, th, tw) = tiles[0].grid_thw
        h, w = (th, tw) if len(tiles) == 1 else (rows * th, cols * tw)
        grid = (t, h, w)
        return Placement("image", self.placeholder, [self.prefix], [self.suffix], grid_thw=grid), (
            t * h * w // self.merge**2,
            self.feature_dim,
        )

    def assemble(self, features: list[TileFeatures], cols: int, rows: int) -> EncoderOutput:
        if len(features) == 1:
            tokens = features[0].rows
        else:  # the tiles' tokens in the whole image's raster order (tokens are 2x2-merged patches)
            (_, th, tw), m = features[0].grid_thw, self.merge
            stacked = np.stack([f.rows for f in features])  # [tiles, th/m * tw/m, dim], row-major tiles
            tokens = stacked.reshape(rows, cols, th // m, tw // m, -1).transpose(0, 2, 1, 3, 4)
            tokens = tokens.reshape(-1, stacked.shape[-1])
        placement, _ = self.placement(features, cols, rows)
        return EncoderOutput(
            embeddings=np.ascontiguousarray(tokens, dtype=np.float32),
            tiles=len(features),
            placement=placement,
        )

    def video_tile(self, frames: np.ndarray) -> VisionTile:
        """One temporal patch of key frames (uint8 [temporal_patch_size, h, w, 3], sides multiples
        of patch x merge: the video pre-stage sized them) -> its patches, laid out as Qwen2-VL's
        video processor lays out a clip: per merged 2x2 cell, channel x time x patch x patch."""
        t, height, width, _ = frames.shape
        p, m = self.patch, self.merge
        if height % (p * m) or width % (p * m):
            raise ValueError(f"key frames of {width}x{height} px are not on the {p * m} px patch grid")
        x = (frames.astype(np.float32).transpose(0, 3, 1, 2) * self.rescale - self.mean) / self.std
        gh, gw = height // p, width // p
        x = x.reshape(t, 3, gh // m, m, p, gw // m, m, p).transpose(2, 5, 3, 6, 1, 0, 4, 7)
        return VisionTile(np.ascontiguousarray(x.reshape(gh * gw, 3 * t * p * p)), (1, gh, gw))

    def assemble_video(self, features: list[TileFeatures], timestamps: list[float]) -> EncoderOutput:
        """The temporal patches' rows in time order: one video of grid (patches in time, h, w).
        Its M-RoPE time axis takes the key frames' mean spacing (a clip thinned to key frames is
        positioned as if evenly sampled: the model has one seconds-per-patch per video)."""
        (_, h, w) = features[0].grid_thw
        rows = np.concatenate([f.rows for f in features])
        span = (timestamps[-1] - timestamps[0]) / (len(timestamps) - 1) if len(timestamps) > 1 else 0.5
        return EncoderOutput(
            embeddings=np.ascontiguousarray(rows, dtype=np.float32),
            tiles=len(features),
            placement=Placement(
                "video",
                self.video_placeholder,
                [self.prefix],
                [self.suffix],
                grid_thw=(len(features), h, w),
                seconds_per_grid=span * self.frames_per_tile,
            ),
        )


def verify(path: Path, options: o.Qwen3OmniVision) -> None:
    checkpoint.verify(path, "thinker_config")


def prepare(dest: Path, options: o.Qwen3OmniVision) -> None:
    checkpoint.prepare(dest)


def load(path: Path, options: o.Qwen3OmniVision) -> VisionEncoder:
    if options.tile_px is None:
        raise ValueError("qwen3_omni_vision needs tile_px (the profile's tiling.tile_px fills it)")
    return VisionEncoder(path, options)
