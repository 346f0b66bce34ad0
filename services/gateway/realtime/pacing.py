"""Audio frames at real time for a WebRTC track (the gateway's playout, the load-test client's
microphone). Light: no aiortc, no Ray (Locust imports it)."""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable

import av

from services.realtime.codecs import PCM_RATE

MAX_LATE_S = 0.1  # a frame sender this far behind real time skips ahead


class FramePacer:
    """An audio track's frames (pcm16 mono, 20 ms) stamped and released at real time: a sender
    asks for the next frame as soon as it sent the last one. A sender more than MAX_LATE_S behind
    (its process starved) goes on from now rather than sending what it missed in one burst: a burst
    would sit in the receiver's jitter buffer (or overflow it) while counted as played, so the
    played position would run ahead of the listener. The audio not yet sent is delayed, not lost.
    `on_late(seconds)` hears of each skip."""

    def __init__(self, rate: int = PCM_RATE, on_late: Callable[[float], None] | None = None):
        self.rate, self.samples = rate, rate // 50
        self._on_late = on_late
        self._start = 0.0
        self._pts = -1

    def delay(self, now: float) -> float:
        """Seconds from `now` until the next frame is due (0: now)."""
        if self._pts < 0:
            self._start, self._pts = now, 0
            return 0.0
        self._pts += self.samples
        late = now - (self._start + self._pts / self.rate)
        if late > MAX_LATE_S:
            self._start += late  # this frame is due now, the next ones a frame apart from it
            if self._on_late is not None:
                self._on_late(late)
            return 0.0
        return max(-late, 0.0)

    async def wait(self) -> None:
        """Until the next frame is due."""
        await asyncio.sleep(self.delay(time.monotonic()))

    def frame(self, pcm: bytes) -> av.AudioFrame:
        """`pcm` (at most a frame's; padded with silence) as the frame due."""
        frame = av.AudioFrame(format="s16", layout="mono", samples=self.samples)
        frame.planes[0].update(pcm + bytes(self.samples * 2 - len(pcm)))
        frame.pts, frame.sample_rate, frame.time_base = self._pts, self.rate, fractions.Fraction(1, self.rate)
        return frame
