"""Audio continuity as a client hears it, computed at the gateway from audio sent vs wall time.

The modelled client starts playing at the first audio chunk and plays in real time; when the next chunk
arrives after everything it had was played, playback stalls for the gap. The gateway counts audio
seconds sent and stall seconds (`omniray_gateway_audio_*_seconds_total`); continuity is
sent / (sent + stalled). Network delay and client jitter buffers are not modelled: this is what a
client that plays each chunk as soon as it can hears (one that buffers first stalls less).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Playback:
    start: float | None = None  # wall time of the first chunk
    audio_s: float = 0.0  # audio received so far
    stall_s: float = 0.0  # playback stalled so far

    def receive(self, now: float, seconds: float) -> float:
        """A chunk of `seconds` of audio arrived at `now`; returns the stall it ended (0 if on time)."""
        gap = 0.0
        if self.start is None:
            self.start = now
        else:
            runs_out = self.start + self.stall_s + self.audio_s  # when the buffered audio was played
            gap = max(0.0, now - runs_out)
            self.stall_s += gap
        self.audio_s += seconds
        return gap
