"""Speech out at the rate its format implies: pcm16 mono at 24 kHz (OpenAI's pcm16, and what a wav
answer declares), whatever rate the profile's vocoder writes (Piper: 22.05 kHz).

One `StreamResampler` per response: libswresample (through PyAV) keeps the filter's state between
chunks, so the chunks of a response resampled one by one join into exactly what resampling the whole
answer at once gives (tests/unit/test_resampler.py) — no clicks or gaps at chunk edges.
"""

from __future__ import annotations

import numpy as np

OUTPUT_RATE = 24_000


class StreamResampler:
    def __init__(self, rate: int, to_rate: int = OUTPUT_RATE):
        import av

        self.rate, self.to_rate = rate, to_rate
        self._swr = None if rate == to_rate else av.AudioResampler(format="s16", layout="mono", rate=to_rate)

    def push(self, pcm16: bytes) -> bytes:
        """The next chunk of pcm16 at `rate` -> what is ready of it at `to_rate` (the filter holds a
        few milliseconds back until the next chunk or `flush`)."""
        if self._swr is None or not pcm16:
            return pcm16
        import av

        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm16, "<i2")[None], format="s16", layout="mono")
        frame.sample_rate = self.rate
        return self._joined(self._swr.resample(frame))

    def flush(self) -> bytes:
        """What the filter still holds, at the end of the response."""
        return b"" if self._swr is None else self._joined(self._swr.resample(None))

    @staticmethod
    def _joined(frames) -> bytes:
        return b"".join(f.to_ndarray()[0].astype("<i2").tobytes() for f in frames)
