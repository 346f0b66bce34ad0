"""Tiny ViT-style vision encoder: 128 px tiles, 16 px patches -> 64 embeddings per tile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from services.models import options as o
from services.models.base import EncoderOutput, frame_image
from services.models.tiny import _weights

TILE = 128
PATCH = 16


class TinyViT(nn.Module):
    def __init__(self, width: int, out_dim: int, layers: int):
        super().__init__()
        self.patch = nn.Conv2d(3, width, PATCH, stride=PATCH)
        self.pos = nn.Parameter(torch.randn(1, (TILE // PATCH) ** 2, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=width * 2, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.proj = nn.Linear(width, out_dim)

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:  # [B, 3, TILE, TILE] -> [B, 64, out]
        x = self.patch(tiles).flatten(2).transpose(1, 2) + self.pos
        return self.proj(self.blocks(x))


def prepare(dest: Path, options: o.TinyVision) -> None:
    torch.manual_seed(options.seed)
    arch = {"width": 64, "out_dim": _weights.thinker_hidden_size(options), "layers": 1}
    _weights.save(TinyViT(**arch), dest, {"arch": arch, "version": "tiny-vit-1"})


def tile_image(image) -> np.ndarray:
    """A tile (or a whole image for a 1x1 grid) at the model's 128 px."""
    img = image.convert("RGB").resize((TILE, TILE))
    arr = np.asarray(img, dtype=np.float32) / 255.0
    return ((arr - 0.5) / 0.5).transpose(2, 0, 1)


class TinyVisionEncoder:
    def __init__(self, path: Path):
        self.model, config = _weights.load(TinyViT, path)
        self.version = config["version"]

    def preprocess(self, tile) -> np.ndarray:
        return tile_image(tile)

    @torch.inference_mode()
    def encode_tiles(self, tiles: list[np.ndarray]) -> list[np.ndarray]:
        return list(self.model(torch.from_numpy(np.stack(tiles))).numpy())

    def assemble(self, features: list[np.ndarray], cols: int, rows: int) -> EncoderOutput:
        """64 embeddings per tile, tiles in grid order."""
        return EncoderOutput(embeddings=np.concatenate(features), tiles=len(features))

    frames_per_tile = 1

    def video_tile(self, frames: np.ndarray) -> np.ndarray:
        return tile_image(frame_image(frames))

    def assemble_video(self, features: list[np.ndarray], timestamps: list[float]) -> EncoderOutput:
        """64 embeddings per key frame, in time order."""
        return EncoderOutput(embeddings=np.concatenate(features), tiles=len(features))


def load(path: Path, options: o.TinyVision) -> TinyVisionEncoder:
    return TinyVisionEncoder(path)
