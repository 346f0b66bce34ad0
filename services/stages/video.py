"""The video pre-stage: a clip -> the key frames the encoder pool sees (and, asked for, its audio
track), its own deployment so that decoding scales apart from the encoders.

One pass over the container (FFmpeg through PyAV, threaded decoding): the frame nearest each sampled
instant (services/policies/frames/sampling.py) is kept when it is not a near-duplicate of the last
kept one (keyframes.py), resized in FFmpeg's scaler to the encoder's patch grid (sizing.py); the
audio track is resampled to 16 kHz mono as it goes. The gateway checked the container's headers and
packets (services/pipeline/video_input.py); what only decoding shows — damaged frames, frames larger
than the header said, no decodable frame — is answered as a refusal (a client error), not raised.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
from omni.v1 import stages_pb2
from ray import serve

from services.dataplane import tensors
from services.extensions.ray.metrics import metric
from services.models.base import ENCODER_RATE
from services.policies.frames.keyframes import KeyFrames
from services.policies.frames.sampling import sample_times
from services.policies.frames.sizing import frame_size
from services.stages._stage import Stage


class Refused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@serve.deployment
class Video(Stage):
    name = "video"

    def __init__(self, profile: dict):
        super().__init__(profile)
        self.frames_total = metric("omniray_video_frames_total", kind=("sampled", "kept", "dropped"))

    async def Sample(self, request: stages_pb2.VideoRequest) -> stages_pb2.VideoFrames:
        with self.operation("sample", request.ctx):
            clip = (await tensors.materialized(request.clip)).tobytes()
            try:
                frames, times, sampled, track = await asyncio.to_thread(sample_clip, clip, request)
            except Refused as e:
                return stages_pb2.VideoFrames(refusal_code=e.code, refusal=e.message)
            for kind, n in (("sampled", sampled), ("kept", len(frames)), ("dropped", sampled - len(frames))):
                if n:  # Ray's counters take positive increments only
                    self.frames_total.inc(n, tags={"kind": kind})
            out = stages_pb2.VideoFrames(frames=tensors.describe(frames), timestamps=times, sampled=sampled)
            if track is not None:
                out.audio.CopyFrom(tensors.describe(track))
            return out


def sample_clip(
    clip: bytes, request: stages_pb2.VideoRequest
) -> tuple[np.ndarray, list[float], int, np.ndarray | None]:
    """-> key frames uint8 [n, h, w, 3], their times, frames sampled, the audio track (or None)."""
    import av

    try:
        with av.open(io.BytesIO(clip), "r") as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            header = (stream.codec_context.width, stream.codec_context.height)
            # the length the gateway counted from the packets (containers state theirs differently)
            times = sample_times(request.seconds, request.fps, request.max_frames)
            audio = container.streams.audio[0] if request.with_audio and container.streams.audio else None
            picker = _Picker(times, header, request)
            track = _Track() if audio is not None else None
            streams = (stream, audio) if audio is not None else (stream,)
            for frame in container.decode(*streams):
                if frame.time is not None and frame.time > request.seconds + 1.0:
                    break
                if isinstance(frame, av.AudioFrame):
                    track.add(frame)
                else:
                    picker.add(frame)
            picker.finish()
    except (av.FFmpegError, ValueError, EOFError, IndexError):
        raise Refused("invalid_video", "video could not be decoded: the file is damaged") from None
    if not picker.kept:
        raise Refused("invalid_video", "video has no decodable frames")
    samples = track.samples() if track is not None else None
    if samples is not None and len(samples) == 0:
        raise Refused("invalid_video", "the clip's audio track could not be decoded")
    return np.stack(picker.kept), picker.kept_times, picker.keys.offered, samples


class _Picker:
    """The decoded frame nearest each sampled instant, when it is a key frame."""

    def __init__(self, times: list[float], header: tuple[int, int], request: stages_pb2.VideoRequest):
        self.times, self.at = times, 0
        self.max_pixels = request.max_frame_pixels or header[0] * header[1]
        self.size = frame_size(*header, request.frame_px, request.frame_multiple)
        self.keys = KeyFrames(request.keyframe_threshold)
        self.kept: list[np.ndarray] = []
        self.kept_times: list[float] = []
        self._previous = None  # (time, frame)

    def add(self, frame) -> None:
        if frame.width * frame.height > self.max_pixels:
            raise Refused("invalid_video", "video frames grow past the size the header states")
        t = float(frame.time or 0.0)
        while self.at < len(self.times) and t >= self.times[self.at]:
            target = self.times[self.at]
            nearer = (
                self._previous if self._previous and target - self._previous[0] < t - target else (t, frame)
            )
            self._offer(*nearer)
            self.at += 1
        self._previous = (t, frame)

    def finish(self) -> None:
        """Instants past the last frame (a clip shorter than stated) take the last frame once."""
        if self.at < len(self.times) and self._previous is not None:
            self._offer(*self._previous)
            self.at = len(self.times)

    def _offer(self, t: float, frame) -> None:
        if self.kept_times and self.kept_times[-1] == t:
            return  # the same frame nearest two instants
        width, height = self.size
        pixels = frame.to_ndarray(width=width, height=height, format="rgb24")
        if self.keys.offer(pixels):
            self.kept.append(pixels)
            self.kept_times.append(round(t, 3))


class _Track:
    """The audio track as float32 mono at the encoders' rate."""

    def __init__(self):
        import av

        self.resampler = av.AudioResampler(format="flt", layout="mono", rate=ENCODER_RATE)
        self.parts: list[np.ndarray] = []

    def add(self, frame) -> None:
        for out in self.resampler.resample(frame):
            self.parts.append(out.to_ndarray().reshape(-1))

    def samples(self) -> np.ndarray:
        for out in self.resampler.resample(None):
            self.parts.append(out.to_ndarray().reshape(-1))
        joined = np.concatenate(self.parts) if self.parts else np.zeros(0)
        return np.ascontiguousarray(joined, dtype=np.float32)
