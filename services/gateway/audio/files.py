"""Speech as a file, written as it streams (POST /v1/audio/speech, omni.v1.Omni/Speech): pcm16 at
24 kHz in, the asked format's bytes out, chunk by chunk, through FFmpeg's encoders and muxers
(PyAV). The muxer writes to a sink that cannot seek, so each format streams (a WAV header carries
the streamed-size placeholder; FLAC leaves its STREAMINFO totals unset) and the bytes of every chunk
can go to the client at once. `speed` is FFmpeg's atempo filter: tempo changes, pitch does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.pipeline.resampler import OUTPUT_RATE


@dataclass(frozen=True)
class FileFormat:
    content_type: str
    muxer: str | None  # None: raw pcm16, no container
    codec: str | None
    options: tuple[tuple[str, str], ...] = ()


FORMATS = {
    "pcm": FileFormat("audio/pcm", None, None),
    "wav": FileFormat("audio/wav", "wav", "pcm_s16le"),
    "mp3": FileFormat("audio/mpeg", "mp3", "libmp3lame"),
    # Ogg pages closed every 100 ms instead of 1 s: the first audio reaches the client sooner.
    "opus": FileFormat("audio/ogg", "ogg", "libopus", (("page_duration", "100000"),)),
    "aac": FileFormat("audio/aac", "adts", "aac"),
    "flac": FileFormat("audio/flac", "flac", "flac"),
}
SPEED_RANGE = (0.25, 4.0)  # OpenAI's
ATEMPO_RANGE = (0.5, 100.0)  # one atempo filter's; slower speeds chain two


class _Sink:
    """A write-only file: the muxer streams into it (no seek back to patch headers)."""

    def __init__(self):
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def _frame(pcm16: bytes, rate: int):
    import av

    frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm16, "<i2")[None], format="s16", layout="mono")
    frame.sample_rate = rate
    return frame


class _Tempo:
    """FFmpeg's atempo filter graph, streaming pcm16 mono."""

    def __init__(self, speed: float, rate: int):
        import av

        self.rate = rate
        self.graph = av.filter.Graph()
        node = self.graph.add_abuffer(format="s16", sample_rate=rate, layout="mono")
        tempos = [speed] if speed >= ATEMPO_RANGE[0] else [ATEMPO_RANGE[0], speed / ATEMPO_RANGE[0]]
        for tempo in tempos:
            nxt = self.graph.add("atempo", f"{tempo:.6f}")
            node.link_to(nxt)
            node = nxt
        sink = self.graph.add("abuffersink")
        node.link_to(sink)
        self.graph.configure()

    def push(self, pcm16: bytes | None) -> list:
        import av

        self.graph.push(None if pcm16 is None else _frame(pcm16, self.rate))
        frames = []
        while True:
            try:
                frames.append(self.graph.pull())
            except (av.BlockingIOError, av.EOFError):
                return frames


class SpeechFile:
    """One response's speech in `fmt`: push pcm16 chunks, then close; each call returns the file's
    next bytes."""

    def __init__(self, fmt: str, speed: float = 1.0, rate: int = OUTPUT_RATE):
        import av

        self.format = FORMATS[fmt]
        self.rate = rate
        self._tempo = None if speed == 1.0 else _Tempo(speed, rate)
        self._sink = _Sink()
        self._out = self._stream = None
        if self.format.muxer is not None:
            self._out = av.open(self._sink, "w", format=self.format.muxer, options=dict(self.format.options))
            self._stream = self._out.add_stream(self.format.codec, rate=rate, layout="mono")

    @property
    def content_type(self) -> str:
        return self.format.content_type

    def push(self, pcm16: bytes) -> bytes:
        if not pcm16:
            return b""
        return self._write(self._tempo.push(pcm16) if self._tempo else [_frame(pcm16, self.rate)])

    def close(self) -> bytes:
        data = self._write(self._tempo.push(None)) if self._tempo else b""
        if self._out is not None:
            for packet in self._stream.encode(None):
                self._out.mux(packet)
            self._out.close()
            data += self._sink.take()
        return data

    def _write(self, frames) -> bytes:
        if self._out is None:
            return b"".join(f.to_ndarray().reshape(-1).astype("<i2").tobytes() for f in frames)
        for frame in frames:
            frame.pts = None  # the encoder numbers samples itself (the filter's pts are in its time base)
            for packet in self._stream.encode(frame):
                self._out.mux(packet)
        return self._sink.take()
