"""Realtime audio formats at the session's edge. `audio/pcm` is the session's own (pcm16 mono at
24 kHz); the telephony formats `audio/pcmu` and `audio/pcma` (G.711 μ-law / A-law, 8 kHz, one byte a
sample) go through FFmpeg's codecs (PyAV) and a streaming resampler on the way in and out, so a
phone bridge talks to a session as it is. Each direction keeps its codec's and resampler's state
across chunks: a session's input is one `InputAudio`, each response's output one `OutputAudio`."""

from __future__ import annotations

import numpy as np

from services.pipeline.resampler import OUTPUT_RATE, StreamResampler
from services.realtime import events as ev

PCM_RATE = OUTPUT_RATE  # the session's audio, in and out: pcm16 mono at 24 kHz
G711 = {"audio/pcmu": "pcm_mulaw", "audio/pcma": "pcm_alaw"}
G711_RATE = 8_000


def _g711(fmt: str, mode: str):
    import av

    ctx = av.CodecContext.create(G711[fmt], mode)
    ctx.sample_rate, ctx.layout = G711_RATE, "mono"
    if mode == "w":
        ctx.format = "s16"
    return ctx


def _pcm16(frames) -> bytes:
    return b"".join(f.to_ndarray().reshape(-1).astype("<i2").tobytes() for f in frames)


class InputAudio:
    """A session's input audio in its format -> pcm16 at 24 kHz."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        if fmt in G711:
            self._codec, self._up = _g711(fmt, "r"), StreamResampler(G711_RATE, PCM_RATE)

    def decode(self, data: bytes, event_id: str | None = None) -> bytes:
        if self.fmt not in G711:
            if len(data) % 2:
                raise ev.RealtimeEventError(
                    "pcm16 audio must have an even number of bytes", event_id=event_id
                )
            return data
        import av

        return self._up.push(_pcm16(self._codec.decode(av.Packet(data)))) if data else b""


class OutputAudio:
    """A response's pcm16 at 24 kHz -> the session's output format."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        if fmt in G711:
            self._codec, self._down = _g711(fmt, "w"), StreamResampler(PCM_RATE, G711_RATE)

    def encode(self, pcm16: bytes) -> bytes:
        return pcm16 if self.fmt not in G711 else self._g711(self._down.push(pcm16))

    def flush(self) -> bytes:
        """What the resampler still holds, at the end of the response."""
        return b"" if self.fmt not in G711 else self._g711(self._down.flush())

    def _g711(self, pcm16: bytes) -> bytes:
        if not pcm16:
            return b""
        import av

        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm16, "<i2")[None], format="s16", layout="mono")
        frame.sample_rate = G711_RATE
        return b"".join(bytes(packet) for packet in self._codec.encode(frame))
