import io

import numpy as np
import pytest
import soundfile
from PIL import Image

from services.common.errors import OmniError
from services.models.profile import LimitsSpec
from services.pipeline import media
from tests.conftest import png_bytes, wav_bytes

LIMITS = LimitsSpec()


def _refused(call, *args, **kwargs) -> OmniError:
    with pytest.raises(OmniError) as e:
        call(*args, **kwargs)
    return e.value


def test_image_header_gives_size():
    header = media.inspect_image(png_bytes(40, 30), LIMITS, param="p")
    assert (header.width, header.height, header.decoded_bytes) == (40, 30, 40 * 30 * 3)
    image = media.image_input(png_bytes(40, 30), "auto", LIMITS, param="p")
    assert image.pixels().shape == (30, 40, 3) and image.pixels().dtype == np.uint8


@pytest.mark.parametrize("data, status", [(b"\x89PNG garbage", 400), (b"", 400)])
def test_image_bad(data, status):
    assert _refused(media.inspect_image, data, LIMITS, param="p").status == status


def test_truncated_jpeg_passes_the_header_but_not_the_decode():
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
    truncated = buf.getvalue()[: len(buf.getvalue()) // 2]
    image = media.image_input(truncated, "auto", LIMITS, param="p")  # the header is fine
    assert _refused(image.pixels).code == "invalid_image"


def test_image_side_limit():
    small = LimitsSpec(max_image_side_px=32)
    assert _refused(media.inspect_image, png_bytes(33, 10), small, param="p").status == 413


def test_pixel_bomb_is_refused_from_its_header():
    """A 1-bit 7000 x 7000 PNG is a few kB on the wire and 147 MB decoded: refused unread."""
    buf = io.BytesIO()
    Image.new("1", (7000, 7000)).save(buf, format="PNG")
    assert len(buf.getvalue()) < 100_000
    err = _refused(media.inspect_image, buf.getvalue(), LimitsSpec(max_image_pixels=40_000_000), param="p")
    assert (err.status, err.code) == (413, "image_too_large")


def test_animated_image_is_refused():
    buf = io.BytesIO()
    frames = [Image.new("RGB", (8, 8), c) for c in ("red", "blue")]
    frames[0].save(buf, format="PNG", save_all=True, append_images=frames[1:])
    assert _refused(media.inspect_image, buf.getvalue(), LIMITS, param="p").code == "invalid_image"


def test_a_damaged_header_of_another_format_is_refused_not_raised():
    """Pillow tries every format's parser on the header; a damaged TIFF's fails with a TypeError."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "TIFF")
    tiff = bytearray(buf.getvalue())
    tiff[31], tiff[133] = 107, 51  # the image length's value, a strip's byte count
    assert _refused(media.inspect_image, bytes(tiff), LIMITS, param="p").code == "invalid_image"


def _mp3(rate: int) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp3") as out:
        stream = out.add_stream("mp3", rate=rate)
        stream.layout = "mono"
        t = np.arange(rate // 2) / rate
        frame = av.AudioFrame.from_ndarray(
            (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None], format="flt", layout="mono"
        )
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


def test_a_compressed_file_whose_rate_changes_midway_is_refused_not_raised():
    """Two MP3s of different rates end to end (`cat`): the second's frames do not match the
    resampler the first set up."""
    assert media.audio_file(_mp3(44_100), LIMITS, param="p").frames > 0
    error = _refused(media.audio_file, _mp3(44_100) + _mp3(22_050), LIMITS, param="p")
    assert (error.status, error.code) == (400, "invalid_audio")


def test_a_float_wav_with_samples_that_are_not_numbers_is_refused():
    buf = io.BytesIO()
    soundfile.write(
        buf, np.array([0.1, np.nan, np.inf] * 800, np.float32), 16000, format="WAV", subtype="FLOAT"
    )
    clip = media.audio_clip(buf.getvalue(), "wav", LIMITS, param="p")  # the header is fine
    assert _refused(clip.for_encoder).code == "invalid_audio"


def _wav(rate=16000, channels=1, frames=1600, subtype="PCM_16") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros((frames, channels), np.float32), rate, format="WAV", subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize(
    "wav",
    [_wav(rate=4000), _wav(rate=192_000), _wav(channels=9), _wav(subtype="ULAW"), _wav(subtype="DOUBLE")],
    ids=["rate_4k", "rate_192k", "9_channels", "ulaw", "double"],
)
def test_wav_header_out_of_range_is_refused(wav):
    assert _refused(media.inspect_audio, wav, "wav", LIMITS, param="p").code == "invalid_audio"


def test_wav_declaring_more_than_it_holds_is_refused():
    wav = bytearray(_wav(frames=1600))
    wav[-1000:] = b""  # the header still declares 1600 frames
    assert _refused(media.inspect_audio, bytes(wav), "wav", LIMITS, param="p").code == "invalid_audio"


def test_streamed_wav_with_placeholder_size_is_accepted():
    wav = bytearray(_wav(frames=1600))
    wav[40:44] = (0x7FFFF000).to_bytes(4, "little")  # as espeak-ng --stdout writes it
    assert media.inspect_audio(bytes(wav), "wav", LIMITS, param="p").frames == 1600


def test_audio_header_gives_seconds_without_decoding():
    header = media.inspect_audio(_wav(rate=8000, channels=2, frames=8000), "wav", LIMITS, param="p")
    assert (header.seconds, header.rate, header.channels) == (1.0, 8000, 2)


def test_audio_is_resampled_to_16k_mono():
    clip = media.audio_clip(wav_bytes(seconds=1.0, rate=22050), "wav", LIMITS, param="p")
    assert not clip.decoded and clip.seconds == 1.0  # from the header alone
    wave = clip.for_encoder()
    assert wave.dtype == np.float32 and abs(len(wave) - 16000) <= 1
    assert clip.for_encoder() is wave  # resampled once


def test_stereo_wav_is_mixed_down():
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros((800, 2), dtype=np.float32), 8000, format="WAV")
    assert media.audio_clip(buf.getvalue(), "wav", LIMITS, param="p").for_encoder().shape == (1600,)


def test_pcm16_input():
    pcm = (np.ones(16000) * 1000).astype("<i2").tobytes()
    wave = media.audio_clip(pcm, "pcm16", LIMITS, param="p").for_encoder()
    assert len(wave) == 16000 and np.allclose(wave, 1000 / 32768)


def test_audio_too_long():
    with pytest.raises(OmniError) as e:
        media.audio_clip(wav_bytes(seconds=3.0), "wav", LimitsSpec(max_audio_seconds=2), param="p")
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
