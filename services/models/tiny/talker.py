"""Tiny talker: an autoregressive GRU that turns text (UTF-8 bytes) into discrete speech units.

Each character yields `units_per_char` units of 20 ms; units are produced greedily and emitted in
chunks so the vocoder can start on the first chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from services.models import options as o
from services.models.tiny import _weights

N_UNITS = 256


class TinyUnitLM(nn.Module):
    def __init__(self, width: int, n_units: int):
        super().__init__()
        self.char_emb = nn.Embedding(256, width)
        self.unit_emb = nn.Embedding(n_units, width)
        self.cell = nn.GRUCell(2 * width, width)
        self.head = nn.Linear(width, n_units)

    def step(self, char: torch.Tensor, prev_unit: torch.Tensor, h: torch.Tensor):
        h = self.cell(torch.cat([self.char_emb(char), self.unit_emb(prev_unit)], -1), h)
        return self.head(h).argmax(-1), h


def prepare(dest: Path, options: o.TinyTalker) -> None:
    torch.manual_seed(options.seed)
    arch = {"width": 64, "n_units": N_UNITS}
    _weights.save(TinyUnitLM(**arch), dest, {"arch": arch, "version": "tiny-talker-1"})


class TinyTalker:
    def __init__(self, path: Path, units_per_char: int, chunk_units: int):
        self.model, config = _weights.load(TinyUnitLM, path)
        self.version = config["version"]
        self.units_per_char = units_per_char
        self.chunk_units = chunk_units

    @torch.inference_mode()
    def stream_units(self, text: str, voice: str) -> Iterator[np.ndarray]:
        # The voice picks the initial state, so voices differ deterministically.
        h = torch.zeros(1, self.model.cell.hidden_size)
        h[0, sum(voice.encode()) % h.shape[1]] = 1.0
        unit = torch.zeros(1, dtype=torch.long)
        pending: list[int] = []
        for byte in text.encode("utf-8"):
            char = torch.tensor([byte])
            for _ in range(self.units_per_char):
                unit, h = self.model.step(char, unit, h)
                pending.append(int(unit))
                if len(pending) >= self.chunk_units:
                    yield np.asarray(pending, dtype=np.int32)
                    pending = []
        if pending:
            yield np.asarray(pending, dtype=np.int32)


def load(path: Path, options: o.TinyTalker) -> TinyTalker:
    return TinyTalker(path, options.units_per_char, options.chunk_units)
