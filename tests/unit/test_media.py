import io

import numpy as np
import pytest
import soundfile
from PIL import Image

from services.common.errors import OmniError
from services.gateway import media
from services.models.profile import LimitsSpec
from tests.conftest import png_bytes, wav_bytes

LIMITS = LimitsSpec()


def test_image_ok_returns_size():
    assert media.validate_image(png_bytes(40, 30), LIMITS, param="p") == (40, 30)


@pytest.mark.parametrize("data, status", [(b"\x89PNG garbage", 400), (b"", 400)])
def test_image_bad(data, status):
    with pytest.raises(OmniError) as e:
        media.validate_image(data, LIMITS, param="p")
    assert e.value.status == status


def test_truncated_jpeg_is_rejected():
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
    with pytest.raises(OmniError) as e:
        media.validate_image(buf.getvalue()[:200], LIMITS, param="p")
    assert e.value.status == 400


def test_image_side_limit():
    small = LimitsSpec(max_image_side_px=32)
    with pytest.raises(OmniError) as e:
        media.validate_image(png_bytes(33, 10), small, param="p")
    assert e.value.status == 413


def test_audio_is_resampled_to_16k_mono():
    wave = media.decode_audio(wav_bytes(seconds=1.0, rate=22050), "wav", LIMITS, param="p")
    assert wave.dtype == np.float32 and abs(len(wave) - 16000) <= 1


def test_stereo_wav_is_mixed_down():
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros((800, 2), dtype=np.float32), 8000, format="WAV")
    assert media.decode_audio(buf.getvalue(), "wav", LIMITS, param="p").shape == (1600,)


def test_pcm16_input():
    pcm = (np.ones(16000) * 1000).astype("<i2").tobytes()
    wave = media.decode_audio(pcm, "pcm16", LIMITS, param="p")
    assert len(wave) == 16000 and np.allclose(wave, 1000 / 32768)


def test_audio_too_long():
    with pytest.raises(OmniError) as e:
        media.decode_audio(wav_bytes(seconds=3.0), "wav", LimitsSpec(max_audio_seconds=2), param="p")
    assert e.value.status == 413


def test_data_url_requires_base64_data_scheme():
    with pytest.raises(OmniError):
        media.data_url_bytes("https://x/y.png", param="p", limit=10)
    with pytest.raises(OmniError):
        media.data_url_bytes("data:image/png,rawtext", param="p", limit=10)
    assert media.data_url_bytes("data:image/png;base64,aGk=", param="p", limit=10) == b"hi"


def test_wav_roundtrip():
    pcm = (np.arange(100) * 10).astype("<i2").tobytes()
    wave, rate = soundfile.read(io.BytesIO(media.wav_bytes(pcm, 24000)), dtype="int16")
    assert rate == 24000 and wave.tobytes() == pcm


def test_errors_survive_pickling():
    import pickle

    e = pickle.loads(pickle.dumps(OmniError(413, "big", code="image_too_large", param="p")))
    assert (e.status, e.message, e.code, e.param) == (413, "big", "image_too_large", "p")
