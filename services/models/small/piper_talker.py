"""Talker for the `small` cascade: text -> espeak-ng phonemes -> Piper front end -> latent frames.

The front end sees a whole text piece (prosody is global over it) and samples the prior once, so
the frames it streams are final; the vocoder decodes them chunk by chunk. Phonemes come from the
espeak-ng program (GPL-3.0), the phonemizer the voice was trained with; it is run as a separate
process (text on stdin: services/models/small/phonemizer.py) and installed as an optional system
package, so the profile lists it in `requires`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from services.models import options as o
from services.models.small import _piper
from services.models.small.phonemizer import StdinPhonemizer

prepare = _piper.prepare


class PiperTalker:
    def __init__(self, path: Path, options: o.PiperTalker):
        self.meta, config = _piper.split(path)
        self.session = _piper.session(path / self.meta.frontend, options)
        inference = config.get("inference", {})
        self.scales = np.array(
            [
                inference.get("noise_scale", 0.667),
                inference.get("length_scale", 1.0),
                inference.get("noise_w", 0.8),
            ],
            np.float32,
        )
        self.phonemizer = StdinPhonemizer(
            {k: v[0] for k, v in config["phoneme_id_map"].items()}, voice=config["espeak"]["voice"]
        )
        # Frames per streamed chunk: a small first one so the vocoder starts early, then larger.
        self.chunk_frames = [int(n) for n in options.chunk_frames]
        self.version = f"piper-{_piper.VOICE}-frontend"

    def stream_units(self, text: str, voice: str) -> Iterator[np.ndarray]:
        ids, _unknown = self.phonemizer.ids(text)
        if len(ids) <= 3:  # BOS, PAD, EOS: nothing to say (punctuation only)
            return
        feed = {
            "input": np.array([ids], np.int64),
            "input_lengths": np.array([len(ids)], np.int64),
            "scales": self.scales,
        }
        z_p = self.session.run(None, {k: v for k, v in feed.items() if k in self.meta.frontend_inputs})[0]
        frames = np.ascontiguousarray(z_p[0].T)  # [T, channels]
        start = i = 0
        while start < len(frames):
            end = start + self.chunk_frames[min(i, len(self.chunk_frames) - 1)]
            yield frames[start:end]
            start, i = end, i + 1


def load(path: Path, options: o.PiperTalker) -> PiperTalker:
    return PiperTalker(path, options)
