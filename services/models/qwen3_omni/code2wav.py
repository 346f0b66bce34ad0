"""Qwen3-Omni's code2wav as the vocoder stage: 16-codebook codec frames (12.5 per second) to 24 kHz
PCM, decoded in chunks as the talker writes them.

The stage hands each chunk its neighbours (`left` / `right`, as many frames as the profile's
`context_frames` / `lookahead_frames`): the chunk is decoded with them and only its own samples
(1920 per frame) are kept. The decoder's last ~555 samples of any input depend on frames after it, so
one frame of lookahead makes the chunk's samples whole; left context bounds the difference to a
whole-utterance decode, since the pre-transformer's sliding window (72 frames a layer) sees further
back than any practical context. Measured on `qwen3-omni-tiny` (tests/contracts/test_qwen3_omni_code2wav.py):
72 frames of context, 1 of lookahead: within 1e-3 of the whole decode's peak.

Only the pre-transformer needs that long context. The convolutions after it (upsampling, decoder)
see CONV_CONTEXT frames back at most, so they run over the chunk, its lookahead and that much of its
context: most of a steady chunk's context is read by the transformer and never upsampled (the
samples kept are the same: tests/contracts/test_qwen3_omni_code2wav.py).

Weights: the `code2wav.` tensors of the model's checkpoint (the thinker's directory), loaded alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.models import options as o
from services.models.base import VocodeInput, alike
from services.models.compiled import BUCKETS, bucket, compiled
from services.models.qwen3_omni import checkpoint

SAMPLE_RATE = 24_000
# Frames of context the convolutions after the pre-transformer read (their receptive field, from the
# architecture's kernels, dilations and upsampling; measured: none reaches further back than 4 frames).
CONV_CONTEXT = 8


class Code2Wav:
    sample_rate = SAMPLE_RATE

    def __init__(self, path: Path, compile: str | None = None):
        """`compile`: None (eager), or torch.compile's backend: one graph per chunk shape and batch
        bucket (services/models/compiled.py)."""
        from transformers import AutoConfig
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

        config = AutoConfig.from_pretrained(path).code2wav_config
        self.model = checkpoint.module(Qwen3OmniMoeCode2Wav, config, path, "code2wav.")
        self.samples_per_frame = int(self.model.total_upsample)
        self.codebooks = config.num_quantizers
        self.version = f"qwen3-omni-code2wav:{path.name}"
        self.compiled = compile is not None
        self._run = (
            compiled(self._forward, compile, graphs=8 * len(BUCKETS)) if self.compiled else self._forward
        )

    def decode(
        self, units: np.ndarray, left: np.ndarray | None, right: np.ndarray | None, voice: str
    ) -> np.ndarray:
        """`units`: [frames, 16] codes; returns their float32 PCM (the last chunk of an utterance,
        with no `right`, is a little shorter: the decoder trims its tail)."""
        return self.decode_batch([VocodeInput(units, left, right, voice)])[0]

    def decode_batch(self, chunks: list[VocodeInput]) -> list[np.ndarray]:
        """Chunks of one shape (their context and length) in one forward, [chunks, 16, frames]."""
        import torch

        device = next(self.model.parameters()).device
        empty = np.zeros((0, self.codebooks), np.int64)
        out: list[np.ndarray] = [empty] * len(chunks)
        for group in alike(chunks):
            codes = np.stack([
                np.concatenate([chunks[i].left if chunks[i].left is not None else empty, chunks[i].units,
                                chunks[i].right if chunks[i].right is not None else empty]).astype(np.int64).T
                for i in group
            ])  # fmt: skip
            left, units, right = chunks[group[0]].shape()
            if self.compiled:  # the batch padded to its bucket: static shapes
                codes = np.concatenate([codes, np.repeat(codes[:1], bucket(len(group)) - len(group), axis=0)])
            with torch.inference_mode():
                wavs = self._run(torch.from_numpy(codes).to(device), left)[:, 0].float().cpu().numpy()
            start = min(left, CONV_CONTEXT) * self.samples_per_frame
            end = start + units * self.samples_per_frame if right else None
            for row, i in enumerate(group):
                out[i] = wavs[row, start:end]
        return out

    def _forward(self, codes, left: int):
        """transformers' forward, with the convolutions over all but the first `left` - CONV_CONTEXT
        frames (their samples are dropped anyway)."""
        m = self.model
        hidden = m.code_embedding(codes + m.code_offset).mean(1)
        hidden = m.pre_transformer(inputs_embeds=hidden).last_hidden_state
        hidden = hidden[:, max(left - CONV_CONTEXT, 0) :].permute(0, 2, 1)
        for blocks in m.upsample:
            for block in blocks:
                hidden = block(hidden)
        for block in m.decoder:
            hidden = block(hidden)
        return hidden.clamp(min=-1, max=1)


def verify(path: Path, options: o.Qwen3OmniCode2Wav) -> None:
    checkpoint.verify(path, "code2wav_config")


def prepare(dest: Path, options: o.Qwen3OmniCode2Wav) -> None:
    checkpoint.prepare(dest)


def load(path: Path, options: o.Qwen3OmniCode2Wav) -> Code2Wav:
    return Code2Wav(path, "inductor" if options.compile else None)
