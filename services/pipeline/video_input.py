"""Video clips from clients (`video_url` parts): the container is checked from its headers and
packets before anything is decoded, so the quota is debited from what the clip is and a hostile
clip costs a demux, never a decode.

Checked: the container is mp4/mov or webm/matroska with a video track a decoder exists for; frame
size (per side and pixels); the track's frame count and length (counted from its packets, which are
not decoded: a webm written by a browser states no duration); the decoding work (frames x pixels);
and with the audio track asked for, the track's length. The video pre-stage (services/stages/
video.py) decodes it after admission and refuses, as a client error, what the packets hid.
"""

from __future__ import annotations

import io

from services.common.errors import bad_request, too_large
from services.models.profile import LimitsSpec
from services.pipeline.media import check_size
from services.pipeline.turn import VideoInput

# FFmpeg demuxers (PyAV's names) a clip may use
VIDEO_CONTAINERS = {"mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm"}
VIDEO_TYPES = "mp4, webm, mov"


def video_input(data: bytes, limits: LimitsSpec, *, with_audio: bool, param: str) -> VideoInput:
    import av

    def invalid(why: str):
        return bad_request(f"video could not be read: {why}", code="invalid_video", param=param)

    if len(data) > limits.max_video_bytes:
        raise too_large(
            f"video is larger than {limits.max_video_bytes} bytes", code="video_too_large", param=param
        )
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if container.format.name not in VIDEO_CONTAINERS:
                raise invalid(f"not a video of a supported type ({VIDEO_TYPES})")
            if not container.streams.video:
                raise invalid("the file has no video track")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if width < 1 or height < 1:
                raise invalid("the video track states no frame size")
            check_size(width, height, limits.max_video_side_px, limits.max_image_pixels, "video", param=param)
            try:
                av.Codec(stream.codec_context.name, "r")
            except (av.FFmpegError, ValueError):
                raise invalid("its video codec is not supported") from None
            audio = container.streams.audio[0] if with_audio and container.streams.audio else None
            frames, seconds = _count(container, stream, limits, param)
            track_seconds = _track_seconds(container, audio, seconds) if audio is not None else 0.0
    except (av.FFmpegError, ValueError, EOFError):
        raise invalid(f"the file is damaged or not a video ({VIDEO_TYPES})") from None
    if frames == 0:
        raise invalid("the video track has no frames")
    if frames * width * height > limits.max_video_decode_pixels:
        raise too_large(
            f"video is too much to decode ({frames} frames of {width}x{height}); send a shorter or "
            "smaller clip",
            code="video_too_large",
            param=param,
        )
    if track_seconds > limits.max_audio_seconds:
        raise too_large(
            f"the clip's audio track is {track_seconds:.1f}s; the audio limit is {limits.max_audio_seconds:g}s",
            code="audio_too_long",
            param=param,
        )
    return VideoInput(
        data=data, width=width, height=height, seconds=seconds, frames=frames, track_seconds=track_seconds
    )


def _count(container, stream, limits: LimitsSpec, param: str) -> tuple[int, float]:
    """Frames (packets) of the video track and its length in seconds, from its packets alone."""
    frames, first, end = 0, None, 0.0
    base = stream.time_base
    for packet in container.demux(stream):
        if packet.size == 0:  # the demuxer's flush packet
            continue
        frames += 1
        if frames > limits.max_video_frames:
            raise too_large(
                f"video has more than {limits.max_video_frames} frames", code="video_too_long", param=param
            )
        if packet.pts is not None and base is not None:
            start = float(packet.pts * base)
            first = start if first is None else min(first, start)
            end = max(end, start + float((packet.duration or 0) * base))
        if end - (first or 0.0) > limits.max_video_seconds:
            raise _too_long(limits, param)
    seconds = end - (first or 0.0)
    if seconds <= 0 and frames:  # no timestamps: the stated rate, else one frame a 25th
        rate = float(stream.average_rate or stream.guessed_rate or 25)
        seconds = frames / rate
    if seconds > limits.max_video_seconds:
        raise _too_long(limits, param)
    return frames, seconds


def _too_long(limits: LimitsSpec, param: str):
    return too_large(
        f"video is longer than the limit of {limits.max_video_seconds:g}s", code="video_too_long", param=param
    )


def _track_seconds(container, audio, video_seconds: float) -> float:
    """The audio track's stated length, else the video's (the pre-stage decodes no further)."""
    if audio.duration is not None and audio.time_base is not None:
        return min(float(audio.duration * audio.time_base), video_seconds)
    return video_seconds
