"""Decode and validate client media before any stage sees it.

Images: PNG or JPEG, at most `max_image_bytes` and `max_image_side_px` per side. Audio: WAV (any
PCM rate, mixed to mono and resampled to 16 kHz) or raw pcm16 at 16 kHz, at most
`max_audio_seconds`. Anything else is a clear 400/413, never a stage failure.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from math import gcd

import numpy as np
import soundfile
from PIL import Image
from scipy.signal import resample_poly

from services.common.errors import bad_request, too_large
from services.models.profile import LimitsSpec

AUDIO_SAMPLE_RATE = 16000
IMAGE_FORMATS = {"PNG", "JPEG"}


def b64decode(data: str, *, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("data is not valid base64", code="invalid_base64", param=param) from None


def data_url_bytes(url: str, *, param: str, limit: int) -> bytes:
    """The payload of a `data:<mime>;base64,<data>` URL; remote URLs are not fetched."""
    if not url.startswith("data:"):
        raise bad_request(
            "only data: URLs are accepted for images (the server does not fetch URLs)",
            code="invalid_image_url",
            param=param,
        )
    header, sep, payload = url.partition(",")
    if not sep or ";base64" not in header:
        raise bad_request(
            "image data URL must be base64 encoded (data:image/png;base64,...)",
            code="invalid_image_url",
            param=param,
        )
    if len(payload) * 3 // 4 > limit:
        raise too_large(f"image is larger than {limit} bytes", code="image_too_large", param=param)
    return b64decode(payload, param=param)


def validate_image(data: bytes, limits: LimitsSpec, *, param: str) -> tuple[int, int]:
    """Checks the image fully decodes; returns (width, height)."""
    if len(data) > limits.max_image_bytes:
        raise too_large(
            f"image is larger than {limits.max_image_bytes} bytes", code="image_too_large", param=param
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            fmt, size = img.format, img.size
            if fmt not in IMAGE_FORMATS:
                raise bad_request(
                    f"unsupported image format {fmt}; send PNG or JPEG", code="invalid_image", param=param
                )
            if max(size) > limits.max_image_side_px:
                raise too_large(
                    f"image is {size[0]}x{size[1]} px; the limit is {limits.max_image_side_px} px per side",
                    code="image_too_large",
                    param=param,
                )
            img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise too_large("image has too many pixels", code="image_too_large", param=param) from None
    except (OSError, SyntaxError, ValueError, Image.UnidentifiedImageError):
        raise bad_request("image could not be decoded", code="invalid_image", param=param) from None
    return size


def decode_audio(data: bytes, fmt: str, limits: LimitsSpec, *, param: str) -> np.ndarray:
    """-> mono float32 at 16 kHz."""
    if len(data) > limits.max_audio_bytes:
        raise too_large(
            f"audio is larger than {limits.max_audio_bytes} bytes", code="audio_too_large", param=param
        )
    if fmt == "pcm16":
        if len(data) % 2:
            raise bad_request(
                "pcm16 audio must have an even number of bytes", code="invalid_audio", param=param
            )
        wave, rate = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0, AUDIO_SAMPLE_RATE
    elif fmt == "wav":
        try:
            info = soundfile.info(io.BytesIO(data))
            if info.format != "WAV":
                raise bad_request("audio is not a WAV file", code="invalid_audio", param=param)
            if info.duration > limits.max_audio_seconds:
                raise too_large(
                    f"audio is {info.duration:.1f}s; the limit is {limits.max_audio_seconds:g}s",
                    code="audio_too_long",
                    param=param,
                )
            wave, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        except soundfile.LibsndfileError:
            raise bad_request(
                "audio could not be decoded as WAV", code="invalid_audio", param=param
            ) from None
        wave = wave.mean(axis=1)
    else:
        raise bad_request(
            f"unsupported audio format {fmt!r}; use 'wav' or 'pcm16'",
            code="invalid_audio_format",
            param=param,
        )
    if len(wave) / rate > limits.max_audio_seconds:
        raise too_large(
            f"audio is {len(wave) / rate:.1f}s; the limit is {limits.max_audio_seconds:g}s",
            code="audio_too_long",
            param=param,
        )
    if len(wave) == 0:
        raise bad_request("audio is empty", code="invalid_audio", param=param)
    if rate != AUDIO_SAMPLE_RATE:
        g = gcd(int(rate), AUDIO_SAMPLE_RATE)
        wave = resample_poly(wave, AUDIO_SAMPLE_RATE // g, int(rate) // g).astype(np.float32)
    return np.ascontiguousarray(wave, dtype=np.float32)


def wav_bytes(pcm16: bytes, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, np.frombuffer(pcm16, dtype="<i2"), sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()
