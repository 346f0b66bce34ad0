"""Server VAD for realtime sessions: Silero (the ONNX model that faster-whisper ships) run as a
stream per session, and the turn segmenter that turns its speech probabilities into OpenAI's
`server_vad` events (threshold, prefix padding, silence duration).

The model keeps recurrent state (h, c) and 64 samples of context between 32 ms windows, so a
session's audio can arrive in appends of any size and give the same probabilities as one pass.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.signal import firwin, lfilter, lfilter_zi

MODEL_RATE = 16_000
WINDOW = 512  # samples per model step at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window the model sees
WINDOW_MS = WINDOW / MODEL_RATE * 1000


# semantic_vad's eagerness as the silence that ends a turn: no end-of-turn model runs here, so
# OpenAI's semantic VAD is server VAD waiting longer the less eager it is (docs/api.md).
EAGERNESS_SILENCE_MS = {"high": 300, "medium": 700, "auto": 700, "low": 1200}


class ServerVad(BaseModel):
    """`session.audio.input.turn_detection` (OpenAI's names and defaults)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=5000)
    silence_duration_ms: int = Field(default=500, ge=0, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"  # semantic_vad

    @property
    def silence_ms(self) -> int:
        """The silence that ends a turn."""
        if self.type == "semantic_vad":
            return EAGERNESS_SILENCE_MS[self.eagerness]
        return self.silence_duration_ms


def _model_path() -> Path:
    import faster_whisper

    return Path(faster_whisper.__file__).parent / "assets" / "silero_vad_v6.onnx"


_SESSION = None
_SESSION_LOCK = threading.Lock()


def _onnx():
    """One inference session per process (ONNX Runtime's `run` is thread-safe)."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            import onnxruntime

            opts = onnxruntime.SessionOptions()
            opts.inter_op_num_threads = opts.intra_op_num_threads = 1
            opts.log_severity_level = 4
            _SESSION = onnxruntime.InferenceSession(
                str(_model_path()), providers=["CPUExecutionProvider"], sess_options=opts
            )
        return _SESSION


class SileroStream:
    """Speech probability of each 32 ms window of one session's input (pcm16 at `rate`)."""

    def __init__(self, rate: int = 24_000):
        g = np.gcd(rate, MODEL_RATE)
        self.up, self.down = MODEL_RATE // g, rate // g
        # Streaming polyphase resampler: zero-stuff by `up`, low-pass (state carried between
        # appends, so chunking does not change the output), keep every `down`-th sample.
        self.taps = firwin(16 * max(self.up, self.down) + 1, 1.0 / max(self.up, self.down)) * self.up
        self.zi = lfilter_zi(self.taps, 1.0) * 0.0
        self.phase = 0  # index, in the next zero-stuffed chunk, of the next sample to keep
        self.h = np.zeros((1, 1, 128), np.float32)
        self.c = np.zeros((1, 1, 128), np.float32)
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)  # 16 kHz samples short of a window

    def _resample(self, samples: np.ndarray) -> np.ndarray:
        stuffed = np.zeros(len(samples) * self.up, np.float64)
        stuffed[:: self.up] = samples
        filtered, self.zi = lfilter(self.taps, 1.0, stuffed, zi=self.zi)
        kept = filtered[self.phase :: self.down]
        self.phase = (self.phase - len(stuffed)) % self.down
        return kept.astype(np.float32)

    def feed(self, pcm16: bytes) -> np.ndarray:
        samples = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0
        self.pending = np.concatenate([self.pending, self._resample(samples)])
        n = len(self.pending) // WINDOW
        if n == 0:
            return np.zeros(0, np.float32)
        windows = self.pending[: n * WINDOW].reshape(n, WINDOW)
        self.pending = self.pending[n * WINDOW :]
        contexts = np.concatenate([self.context[None], windows[:-1, -CONTEXT:]])
        self.context = windows[-1, -CONTEXT:].copy()
        batch = np.concatenate([contexts, windows], axis=1)
        probs, self.h, self.c = _onnx().run(None, {"input": batch, "h": self.h, "c": self.c})
        return np.asarray(probs, np.float32).reshape(-1)


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["speech_started", "speech_stopped"]
    audio_ms: int  # start (with prefix padding) or end of speech, in the session's input audio


class TurnSegmenter:
    """Speech starts at the first window at or above `threshold`; it stops after
    `silence_duration_ms` of windows below `threshold - 0.15` (hysteresis, as Silero's own
    segmenter). Positions are milliseconds of the session's input audio."""

    def __init__(self, params: ServerVad, origin_ms: float = 0.0, window_ms: float = WINDOW_MS):
        self.params, self.origin_ms, self.window_ms = params, origin_ms, window_ms
        self.windows = 0  # windows seen
        self.speaking = False
        self.silent_windows = 0
        self.speech_end_ms = 0.0

    @property
    def earliest_start_ms(self) -> int | None:
        """The earliest position a speech start not seen yet can report: the next window's start less
        the prefix padding (None while speech is on). Input before it can never join a turn."""
        if self.speaking:
            return None
        next_ms = self.origin_ms + self.windows * self.window_ms
        return int(max(self.origin_ms, next_ms - self.params.prefix_padding_ms))

    def push(self, probs: np.ndarray) -> list[VadEvent]:
        out: list[VadEvent] = []
        low = max(self.params.threshold - 0.15, 0.01)
        for p in np.asarray(probs, np.float32).reshape(-1):
            start_ms = self.origin_ms + self.windows * self.window_ms
            self.windows += 1
            if not self.speaking:
                if p >= self.params.threshold:
                    self.speaking, self.silent_windows = True, 0
                    self.speech_end_ms = start_ms + self.window_ms
                    begin = max(self.origin_ms, start_ms - self.params.prefix_padding_ms)
                    out.append(VadEvent("speech_started", int(begin)))
            elif p < low:
                self.silent_windows += 1
                if self.silent_windows * self.window_ms >= self.params.silence_ms:
                    self.speaking = False
                    out.append(VadEvent("speech_stopped", int(self.speech_end_ms)))
            else:
                self.silent_windows = 0
                self.speech_end_ms = start_ms + self.window_ms
        return out
