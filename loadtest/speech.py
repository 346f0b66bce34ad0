"""Real speech for voice load: espeak-ng sentences as pcm16 mono at the realtime API's 24 kHz
(robotic but transcribable; server VAD hears it as speech)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

RATE = 24_000
SENTENCES = [
    "What is the weather like in Paris today?",
    "Tell me a short story about a dragon.",
    "How do I make a cup of green tea?",
    "Can you explain how airplanes fly?",
    "What should I cook for dinner tonight?",
    "Give me three tips for better sleep.",
]


def speech(text: str, tmp: Path) -> bytes:
    wav = tmp / f"{abs(hash(text))}.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True)
    voice, rate = sf.read(wav, dtype="float32")
    return (np.clip(resample_poly(voice, RATE, rate), -1, 1) * 32767).astype("<i2").tobytes()
