"""Decode and validate client media before any stage sees it.

Two steps, so that the quota is debited from what the headers say before anything is decoded:
`audio_clip` / `image_input` read the header only (image format, size, pixel count and frames; WAV
rate, channels, sample width and declared length against the bytes sent) and return typed items
(services/pipeline/turn.py) that decode on first use, after admission. Images: single-frame PNG or JPEG within `max_image_bytes`,
`max_image_side_px` per side and `max_image_pixels`. Audio: WAV (8-96 kHz, up to 8 channels, mixed to
mono and resampled to 16 kHz) or raw pcm16 at 16 kHz, at most `max_audio_seconds`. Anything else is a
clear 400/413, never a stage failure.

Audio files uploaded for transcription (`audio_file`) may also be compressed (mp3, flac, ogg/opus,
webm, m4a): those have no header that states their length truthfully, so they are decoded (FFmpeg
through PyAV, in the caller's thread) before admission, stopping at `max_audio_seconds`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass

import numpy as np
import soundfile
from PIL import Image

from services.common.errors import bad_request, too_large
from services.models.profile import LimitsSpec
from services.pipeline.turn import ENCODER_RATE, AudioClip, ImageInput

# raw pcm16 input is at the encoders' rate
AUDIO_SAMPLE_RATE = ENCODER_RATE
IMAGE_FORMATS = {"PNG", "JPEG"}
AUDIO_FORMATS = ("wav", "pcm16")
MIN_AUDIO_RATE, MAX_AUDIO_RATE = 8_000, 96_000
MAX_AUDIO_CHANNELS = 8
WAV_SUBTYPES = {"PCM_U8": 1, "PCM_16": 2, "PCM_24": 3, "PCM_32": 4, "FLOAT": 4}  # bytes per sample


def b64decode(data: str, *, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("data is not valid base64", code="invalid_base64", param=param) from None


# what a data: URL carries -> (its error code prefix, an example media type)
DATA_URL_KINDS = {"image": "image/png", "video": "video/mp4", "file": "application/pdf"}


def data_url_bytes(url: str, *, param: str, limit: int, what: str = "image") -> bytes:
    """The payload of a `data:<mime>;base64,<data>` URL; remote URLs are not fetched."""
    if not url.startswith("data:"):
        raise bad_request(
            f"only data: URLs are accepted for {what}s (the server does not fetch URLs)",
            code=f"invalid_{what}_url",
            param=param,
        )
    header, sep, payload = url.partition(",")
    if not sep or ";base64" not in header:
        raise bad_request(
            f"{what} data URL must be base64 encoded (data:{DATA_URL_KINDS[what]};base64,...)",
            code=f"invalid_{what}_url",
            param=param,
        )
    if len(payload) * 3 // 4 > limit:
        raise too_large(f"{what} is larger than {limit} bytes", code=f"{what}_too_large", param=param)
    return b64decode(payload, param=param)


@dataclass(frozen=True)
class ImageHeader:
    width: int
    height: int

    @property
    def decoded_bytes(self) -> int:
        return self.width * self.height * 3  # RGB, as the encoder decodes it


@dataclass(frozen=True)
class AudioHeader:
    frames: int
    rate: int
    channels: int

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    @property
    def decoded_bytes(self) -> int:
        # float32 as read, then mono at 16 kHz
        return self.frames * self.channels * 4 + int(self.seconds * AUDIO_SAMPLE_RATE) * 4


def inspect_image(data: bytes, limits: LimitsSpec, *, param: str) -> ImageHeader:
    """Format, size and frames from the header alone: nothing is decoded (decompression bombs are
    refused before they allocate)."""
    if len(data) > limits.max_image_bytes:
        raise too_large(
            f"image is larger than {limits.max_image_bytes} bytes", code="image_too_large", param=param
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            fmt, (width, height), frames = img.format, img.size, getattr(img, "n_frames", 1)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise too_large("image has too many pixels", code="image_too_large", param=param) from None
    except Exception:  # a damaged header fails each format's parser its own way (TypeError, IndexError, ...)
        raise bad_request("image could not be decoded", code="invalid_image", param=param) from None
    if fmt not in IMAGE_FORMATS:
        raise bad_request(
            f"unsupported image format {fmt}; send PNG or JPEG", code="invalid_image", param=param
        )
    if frames != 1:
        raise bad_request("animated images are not accepted", code="invalid_image", param=param)
    check_size(width, height, limits.max_image_side_px, limits.max_image_pixels, "image", param=param)
    return ImageHeader(width, height)


def check_size(width: int, height: int, max_side: int, max_pixels: int, what: str, *, param: str) -> None:
    """An image's or a video frame's size (from a header) within a side and a pixel limit: a 413
    `<what>_too_large` otherwise."""
    if max(width, height) > max_side:
        raise too_large(
            f"{what} is {width}x{height} px; the limit is {max_side} px per side",
            code=f"{what}_too_large",
            param=param,
        )
    if width * height > max_pixels:
        raise too_large(
            f"{what} is {width}x{height} px; the limit is {max_pixels} pixels",
            code=f"{what}_too_large",
            param=param,
        )


def decode_image(data: bytes, *, param: str) -> np.ndarray:
    """The image as uint8 RGB [height, width, 3] (after inspect_image: its size is known to be within
    limits)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise bad_request("image could not be decoded", code="invalid_image", param=param) from None


def image_input(data: bytes, detail: str, limits: LimitsSpec, *, param: str) -> ImageInput:
    """A client image, header checked now, pixels decoded on first use."""
    header = inspect_image(data, limits, param=param)
    return ImageInput(
        width=header.width,
        height=header.height,
        detail=detail,
        content_hash=hashlib.sha256(data).hexdigest(),
        decode=lambda: decode_image(data, param=param),
    )


def audio_clip(data: bytes, fmt: str, limits: LimitsSpec, *, param: str) -> AudioClip:
    """A client audio payload, header checked now, samples decoded on first use."""
    header = inspect_audio(data, fmt, limits, param=param)
    return AudioClip(
        rate=header.rate,
        frames=header.frames,
        decode=lambda: _decode_audio(data, fmt, param=param),
        decoded_bytes=header.decoded_bytes,
    )


def inspect_audio(data: bytes, fmt: str, limits: LimitsSpec, *, param: str) -> AudioHeader:
    """Rate, channels, sample width and length from the header, checked against the bytes actually
    sent; nothing is decoded."""
    if len(data) > limits.max_audio_bytes:
        raise too_large(
            f"audio is larger than {limits.max_audio_bytes} bytes", code="audio_too_large", param=param
        )
    if fmt == "pcm16":
        if len(data) % 2:
            raise bad_request(
                "pcm16 audio must have an even number of bytes", code="invalid_audio", param=param
            )
        header = AudioHeader(len(data) // 2, AUDIO_SAMPLE_RATE, 1)
    elif fmt == "wav":
        try:
            info = soundfile.info(io.BytesIO(data))
        except soundfile.LibsndfileError:
            raise bad_request(
                "audio could not be decoded as WAV", code="invalid_audio", param=param
            ) from None
        if info.format != "WAV":
            raise bad_request("audio is not a WAV file", code="invalid_audio", param=param)
        if info.subtype not in WAV_SUBTYPES:
            raise bad_request(
                f"WAV samples must be one of {sorted(WAV_SUBTYPES)}", code="invalid_audio", param=param
            )
        if not MIN_AUDIO_RATE <= info.samplerate <= MAX_AUDIO_RATE:
            raise bad_request(
                f"WAV sample rate must be {MIN_AUDIO_RATE}-{MAX_AUDIO_RATE} Hz",
                code="invalid_audio",
                param=param,
            )
        if not 1 <= info.channels <= MAX_AUDIO_CHANNELS:
            raise bad_request(
                f"WAV must have 1-{MAX_AUDIO_CHANNELS} channels", code="invalid_audio", param=param
            )
        if _wav_data_short(data):
            raise bad_request(
                "WAV header declares more audio than the file holds", code="invalid_audio", param=param
            )
        header = AudioHeader(info.frames, info.samplerate, info.channels)
    else:
        raise bad_request(
            f"unsupported audio format; use one of {AUDIO_FORMATS}", code="invalid_audio_format", param=param
        )
    if header.frames == 0:
        raise bad_request("audio is empty", code="invalid_audio", param=param)
    if header.seconds > limits.max_audio_seconds:
        raise too_large(
            f"audio is {header.seconds:.1f}s; the limit is {limits.max_audio_seconds:g}s",
            code="audio_too_long",
            param=param,
        )
    return header


# Writers that stream WAV to a pipe put a placeholder in the data chunk's size (0, or near 2 GiB).
STREAMED_WAV_SIZES = range(0x7FFF0000, 0x100000000)


def _wav_data_short(data: bytes) -> bool:
    """The data chunk's declared size is more than the bytes that follow it (libsndfile silently
    reads what is there; the declared size is a lie worth refusing). Streamed placeholders pass."""
    at = 12  # after "RIFF", the RIFF size and "WAVE"
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
        if chunk == b"data":
            return size != 0 and size not in STREAMED_WAV_SIZES and size > len(data) - at - 8
        at += 8 + size + (size & 1)  # chunks are padded to even sizes
    return False


def _decode_audio(data: bytes, fmt: str, *, param: str) -> np.ndarray:
    """-> mono float32 at the file's own rate (after inspect_audio)."""
    if fmt == "pcm16":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    try:
        wave = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)[0].mean(axis=1)
    except soundfile.LibsndfileError:
        raise bad_request("audio could not be decoded as WAV", code="invalid_audio", param=param) from None
    if not np.isfinite(wave).all():  # float samples can be NaN or infinite: no encoder takes those
        raise bad_request("WAV samples must be finite numbers", code="invalid_audio", param=param)
    return np.ascontiguousarray(wave, dtype=np.float32)


# FFmpeg demuxers a transcription upload may use (av's names); anything else probed is refused.
AUDIO_FILE_CONTAINERS = {"mp3", "flac", "ogg", "matroska,webm", "mov,mp4,m4a,3gp,3g2,mj2", "aac", "wav"}
AUDIO_FILE_TYPES = "wav, mp3, flac, ogg, webm, m4a, aac"


def audio_file(data: bytes, limits: LimitsSpec, *, param: str) -> AudioClip:
    """An uploaded audio file of any common type. WAV is inspected from its header and decoded on
    use; compressed files are decoded now, to mono at ENCODER_RATE, at most `max_audio_seconds`."""
    if data[:4] == b"RIFF":
        return audio_clip(data, "wav", limits, param=param)
    if len(data) > limits.max_audio_bytes:
        raise too_large(
            f"audio is larger than {limits.max_audio_bytes} bytes", code="audio_too_large", param=param
        )
    samples = _decode_compressed(data, limits, param=param)
    return AudioClip(rate=ENCODER_RATE, frames=len(samples), samples=samples)


def _decode_compressed(data: bytes, limits: LimitsSpec, *, param: str) -> np.ndarray:
    import av

    def invalid(why: str):
        return bad_request(
            f"audio could not be decoded: {why}; use {AUDIO_FILE_TYPES}", code="invalid_audio", param=param
        )

    limit = int(limits.max_audio_seconds * ENCODER_RATE)
    resampler = av.AudioResampler(format="flt", layout="mono", rate=ENCODER_RATE)
    parts: list[np.ndarray] = []
    frames = 0
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if container.format.name not in AUDIO_FILE_CONTAINERS or not container.streams.audio:
                raise invalid("not an audio file of a supported type")
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
                    frames += out.samples
                if frames > limit:
                    raise too_large(
                        f"audio is longer than the limit of {limits.max_audio_seconds:g}s",
                        code="audio_too_long",
                        param=param,
                    )
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().reshape(-1))
    # ValueError: frames whose rate or layout changes mid-file (the resampler is set up by the
    # first), and tags that are not UTF-8
    except (av.FFmpegError, ValueError):
        raise invalid("the file is damaged or of an unsupported type") from None
    samples = np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros(0), dtype=np.float32)
    if len(samples) == 0:
        raise bad_request("audio is empty", code="invalid_audio", param=param)
    return samples


def wav_bytes(pcm16: bytes, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, np.frombuffer(pcm16, dtype="<i2"), sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()
