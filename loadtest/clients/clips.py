"""Video clips and PDFs for tests and benchmarks, made here (PyAV's encoders, Pillow's PDF writer):
nothing is downloaded, and each is the same bytes for the same arguments."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
from PIL import Image, ImageDraw

CONTAINERS = {
    "mp4": ("mp4", "libx264", "aac"),
    "webm": ("webm", "libvpx", "libopus"),
    "mov": ("mov", "mpeg4", "aac"),
    # raw frames: what Chromium's fake camera plays (--use-file-for-fake-video-capture)
    "y4m": ("yuv4mpegpipe", "rawvideo", ""),
}


def frame_at(i: int, width: int, height: int, motion: str, picture: np.ndarray | None = None) -> np.ndarray:
    """A frame of a test scene: `moving` (a bright square crossing the background), `static` (the
    background alone: a camera on a still scene) or `cuts` (a new colour every 10 frames). The
    background is `picture` (resized) or a gradient."""
    if picture is not None:
        frame = np.asarray(Image.fromarray(picture).convert("RGB").resize((width, height)))
        frame = frame.copy()
    else:
        y, x = np.mgrid[0:height, 0:width]
        base = np.stack(
            [x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), np.full_like(x, 96)], -1
        )
        frame = base.astype(np.uint8)
    if motion == "moving":
        side = max(4, min(width, height) // 4)
        left = (i * 7) % max(1, width - side)
        frame[height // 3 : height // 3 + side, left : left + side] = 255
    elif motion == "cuts":
        frame[:] = np.array([(i // 10) * 67 % 256, (i // 10) * 151 % 256, (i // 10) * 29 % 256], np.uint8)
    return frame


def video_clip(
    seconds: float = 2.0,
    fps: int = 10,
    size: tuple[int, int] = (96, 64),
    container: str = "mp4",
    motion: str = "moving",
    audio_hz: float = 0.0,
    picture: np.ndarray | None = None,
) -> bytes:
    """An encoded clip; with `audio_hz`, an audio track with a tone of that pitch; `picture`: the
    scene's background (else a gradient)."""
    fmt, vcodec, acodec = CONTAINERS[container]
    width, height = size
    buf = io.BytesIO()
    with _open(buf, fmt) as out:
        video = out.add_stream(vcodec, rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        if vcodec == "libx264":
            video.options = {"preset": "ultrafast"}
        audio = None
        if audio_hz:
            audio = out.add_stream(acodec, rate=48000)
            audio.layout = "mono"
        for i in range(round(seconds * fps)):
            frame = _video_frame(frame_at(i, width, height, motion, picture), i, fps)
            for packet in video.encode(frame):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if audio is not None:
            _write_tone(out, audio, seconds, audio_hz)
    return buf.getvalue()


def _open(buf, fmt):
    import av

    return av.open(buf, "w", format=fmt)


def _video_frame(pixels: np.ndarray, i: int, fps: int):
    import av

    frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
    frame.pts, frame.time_base = i, Fraction(1, fps)
    return frame


def _write_tone(out, stream, seconds: float, hz: float) -> None:
    import av

    rate, size = 48000, stream.codec_context.frame_size or 960
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    for at in range(0, len(wave) - size + 1, size):
        frame = av.AudioFrame.from_ndarray(wave[None, at : at + size], format="flt", layout="mono")
        frame.sample_rate, frame.pts = rate, at
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)


def pdf_document(
    pages: int = 3, size: tuple[int, int] = (612, 792), pictures: dict[int, np.ndarray] | None = None
) -> bytes:
    """A PDF of `pages` pages, each with its number written large (Pillow writes one image per page);
    `pictures`: page number -> a picture that fills that page instead."""
    images = []
    for n in range(1, pages + 1):
        if pictures and n in pictures:
            images.append(Image.fromarray(pictures[n]).convert("RGB").resize(size))
            continue
        w, h = size
        page = Image.new("RGB", size, "white")
        draw = ImageDraw.Draw(page)
        draw.rectangle((w // 15, h // 20, w - w // 15, h // 6), outline="black", width=max(1, w // 200))
        draw.text((w // 10, h // 12), f"Page {n} of {pages}", fill="black")
        left = w // 6 + (n * 7) % (w // 3)
        draw.ellipse((left, h * 2 // 5, left + w // 3, h * 3 // 5), fill=(n * 40 % 256, 80, 160))
        images.append(page)
    buf = io.BytesIO()
    images[0].save(buf, "PDF", save_all=True, append_images=images[1:], resolution=72.0)
    return buf.getvalue()
