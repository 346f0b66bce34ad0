"""Qwen3-Omni's own audio encoder as the encoder pool's audio model: 16 kHz PCM -> Whisper features
(128 mel bins; the wave padded to whole hops, as vLLM pads it) -> the audio tower (`thinker.audio_tower.`
tensors of the checkpoint, loaded alone). Clips of one call are one forward pass. The output is placed by
vLLM as the model's audio input: its mel frame count sizes the placeholder span and the positions
(services/extensions/vllm/qwen3_omni_thinker.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.models import options as o
from services.models.base import EncoderOutput, Placement
from services.models.qwen3_omni import checkpoint

SAMPLE_RATE = 16_000


class AudioEncoder:
    sample_rate = SAMPLE_RATE

    def __init__(self, path: Path, options: o.Qwen3OmniAudio):
        from transformers import AutoConfig, WhisperFeatureExtractor
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

        config = AutoConfig.from_pretrained(path).thinker_config.audio_config
        self.model = checkpoint.module(
            Qwen3OmniMoeAudioEncoder, config, path, "thinker.audio_tower.", options.dtype
        )
        self.features = WhisperFeatureExtractor.from_pretrained(path)
        self.prefix, self.placeholder, self.suffix = checkpoint.token_ids(
            path, "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"
        )
        self.version = f"qwen3-omni-audio:{path.name}"

    def _mel(self, wave: np.ndarray) -> np.ndarray:
        """[128, frames]: one frame per hop of the wave padded to whole hops (as vLLM pads it)."""
        hop = self.features.hop_length
        wave = np.pad(wave, (0, -len(wave) % hop))
        out = self.features(
            wave, sampling_rate=SAMPLE_RATE, padding=True, truncation=False, return_attention_mask=True,
            return_tensors="np",
        )  # fmt: skip
        frames = int(out["attention_mask"][0].sum())
        return out["input_features"][0][:, :frames].astype(np.float32)

    def encode(self, waves: list[np.ndarray]) -> list[EncoderOutput]:
        import torch

        mels = [self._mel(w) for w in waves]
        p = next(self.model.parameters())
        lengths = torch.tensor([m.shape[1] for m in mels], device=p.device)
        features = torch.from_numpy(np.concatenate(mels, axis=1)).to(p.device, p.dtype)
        with torch.inference_mode():
            rows = self.model(features, feature_lens=lengths).last_hidden_state.float().cpu().numpy()
        sizes = _output_lengths(lengths.cpu()).tolist()
        return [
            EncoderOutput(
                embeddings=np.ascontiguousarray(feats),
                audio_seconds=len(wave) / SAMPLE_RATE,
                placement=Placement(
                    "audio", self.placeholder, [self.prefix], [self.suffix], feature_frames=int(n)
                ),
            )
            for wave, feats, n in zip(
                waves, np.split(rows, np.cumsum(sizes)[:-1]), lengths.tolist(), strict=True
            )
        ]


def _output_lengths(mel_frames):
    """Audio tower tokens per clip: 13 per 100 mel frames (1 s), and the remainder's three stride-2
    convolutions (the model's own rule, as transformers and vLLM compute it)."""
    rest = mel_frames % 100
    conv = (rest - 1) // 2 + 1
    return ((conv - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // 100) * 13


def verify(path: Path, options: o.Qwen3OmniAudio) -> None:
    checkpoint.verify(path, "thinker_config")


def prepare(dest: Path, options: o.Qwen3OmniAudio) -> None:
    checkpoint.prepare(dest)


def load(path: Path, options: o.Qwen3OmniAudio) -> AudioEncoder:
    return AudioEncoder(path, options)
