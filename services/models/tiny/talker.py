"""Tiny talker: an autoregressive GRU that turns text (UTF-8 bytes) into discrete speech units.

Each character yields `units_per_char` units of 20 ms; units are produced greedily and emitted in
chunks of `chunk_units` so the vocoder can start on the first chunk. Every text piece a replica
speaks steps in one batch (services/models/stream_loop.py): a step writes the next chunk of each.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from services.models import options as o
from services.models.stream_loop import End, Stream, StreamLoop
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


@dataclass
class _State:
    chars: torch.Tensor  # the text's bytes, one per `units_per_char` units
    h: torch.Tensor  # [width] the GRU's state
    unit: int = 0  # the unit written last
    done: int = 0  # units written


class TextStream(Stream):
    """One text piece's units; its text is whole from the start."""

    def __init__(self, talker: TinyTalker, text: str, voice: str):
        super().__init__()
        self.t, self.text, self.voice = talker, text, voice

    def loop(self) -> StreamLoop:
        return self.t.loop

    def ready(self) -> bool:
        return True


class TinyTalker:
    def __init__(self, path: Path, options: o.TinyTalker):
        self.model, config = _weights.load(TinyUnitLM, path)
        self.version = config["version"]
        self.units_per_char = options.units_per_char
        self.chunk_units = options.chunk_units
        self.loop = StreamLoop(
            self,
            "tiny-talker",
            options.max_streams,
            options.step_batch,
            bool(options.async_output),  # a CPU model: off unless asked
            options.cpu_threads,
        )

    def stream(self, text: str, voice: str) -> TextStream:
        return TextStream(self, text, voice)

    def stream_units(self, text: str, voice: str) -> Iterator[np.ndarray]:
        return self.stream(text, voice).frames()

    # ---- StepModel: the next chunk of every stream in one batch ---------------------------------

    def step(self, streams: list[TextStream]) -> list:
        for s in streams:
            if s.state is None:
                # The voice picks the initial state, so voices differ deterministically.
                h = torch.zeros(self.model.cell.hidden_size)
                h[sum(s.voice.encode()) % h.shape[0]] = 1.0
                s.state = _State(torch.tensor(list(s.text.encode("utf-8")), dtype=torch.long), h)
        total = [len(s.state.chars) * self.units_per_char for s in streams]
        left = [min(self.chunk_units, n - s.state.done) for s, n in zip(streams, total, strict=True)]
        written: list[list[int]] = [[] for _ in streams]
        for k in range(max(left, default=0)):
            rows = [i for i, n in enumerate(left) if n > k]
            states = [streams[i].state for i in rows]
            chars = torch.stack([st.chars[st.done // self.units_per_char] for st in states])
            units = torch.tensor([st.unit for st in states])
            new, h = self.model.step(chars, units, torch.stack([st.h for st in states]))
            for r, (i, st) in enumerate(zip(rows, states, strict=True)):
                st.unit, st.h, st.done = int(new[r]), h[r], st.done + 1
                written[i].append(st.unit)
        return [np.asarray(w, dtype=np.int32) if w else End("text") for w in written]

    def leave(self, stream: TextStream) -> None:
        pass

    def output(self, frame: np.ndarray) -> np.ndarray:
        return frame


def load(path: Path, options: o.TinyTalker) -> TinyTalker:
    return TinyTalker(path, options)
