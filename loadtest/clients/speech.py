"""Real speech for voice load and tests: espeak-ng sentences (robotic but transcribable; server VAD
hears them as speech). The text goes to espeak-ng on stdin, never on its command line, so a
sentence starting with `-` is spoken, not read as an option."""

from __future__ import annotations

import io
import subprocess

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

RATE = 24_000  # the realtime API's pcm16 rate
SENTENCES = [
    "What is the weather like in Paris today?",
    "Tell me a short story about a dragon.",
    "How do I make a cup of green tea?",
    "Can you explain how airplanes fly?",
    "What should I cook for dinner tonight?",
    "Give me three tips for better sleep.",
]


def spoken_wav(text: str) -> bytes:
    """espeak-ng speaking `text`, as WAV file bytes."""
    return subprocess.run(
        ["espeak-ng", "--stdin", "--stdout"], input=text.encode(), capture_output=True, check=True, timeout=60
    ).stdout


def speech(text: str, rate: int = RATE) -> bytes:
    """`text` spoken, as pcm16 mono at `rate`."""
    voice, voice_rate = sf.read(io.BytesIO(spoken_wav(text)), dtype="float32")
    return (np.clip(resample_poly(voice, rate, voice_rate), -1, 1) * 32767).astype("<i2").tobytes()
