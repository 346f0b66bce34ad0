"""Tiny audio encoder: log-mel frames (10 ms) -> strided conv -> 25 embeddings per second."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from services.models import options as o
from services.models.base import EncoderOutput
from services.models.tiny import _weights

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 40


def _mel_filterbank(n_mels: int, n_fft: int, sr: int) -> np.ndarray:
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    mels = np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    bins = np.floor((n_fft + 1) * hz / sr).astype(int)
    fb = np.zeros((n_mels, n_fft // 2 + 1), dtype=np.float32)
    for m in range(1, n_mels + 1):
        lo, mid, hi = bins[m - 1], bins[m], bins[m + 1]
        for k in range(lo, mid):
            fb[m - 1, k] = (k - lo) / max(mid - lo, 1)
        for k in range(mid, hi):
            fb[m - 1, k] = (hi - k) / max(hi - mid, 1)
    return fb


_FB = _mel_filterbank(N_MELS, N_FFT, SAMPLE_RATE)


def log_mel(wave: np.ndarray) -> np.ndarray:
    """[samples] float32 -> [frames, N_MELS]."""
    if len(wave) < N_FFT:
        wave = np.pad(wave, (0, N_FFT - len(wave)))
    n_frames = 1 + (len(wave) - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n_frames)[:, None]
    frames = wave[idx] * np.hanning(N_FFT).astype(np.float32)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    return np.log(power @ _FB.T + 1e-6).astype(np.float32)


class TinyAudioNet(nn.Module):
    def __init__(self, width: int, out_dim: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv1d(N_MELS, width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1),
            nn.GELU(),
        )
        self.proj = nn.Linear(width, out_dim)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # [1, frames, mels] -> [1, frames/4, out]
        return self.proj(self.conv(mel.transpose(1, 2)).transpose(1, 2))


def prepare(dest: Path, options: o.TinyAudio) -> None:
    torch.manual_seed(options.seed)
    arch = {"width": 64, "out_dim": _weights.thinker_hidden_size(options)}
    _weights.save(TinyAudioNet(**arch), dest, {"arch": arch, "version": "tiny-audio-1"})


class TinyAudioEncoder:
    sample_rate = SAMPLE_RATE

    def __init__(self, path: Path):
        self.model, config = _weights.load(TinyAudioNet, path)
        self.version = config["version"]

    @torch.inference_mode()
    def encode(self, waves: list[np.ndarray]) -> list[EncoderOutput]:
        out = []
        for wave in waves:  # lengths differ; per-item forward is cheap at this size
            feats = self.model(torch.from_numpy(log_mel(wave))[None])[0].numpy()
            out.append(EncoderOutput(embeddings=feats, audio_seconds=len(wave) / SAMPLE_RATE))
        return out


def load(path: Path, options: o.TinyAudio) -> TinyAudioEncoder:
    return TinyAudioEncoder(path)
