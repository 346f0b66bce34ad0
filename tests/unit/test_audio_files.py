"""The audio endpoints' edges without a cluster: speech files written chunk by chunk (lossless ones
decode to exactly the samples pushed, however they were cut), `speed` through atempo, uploaded files
decoded within their limits, transcripts rendered as json / srt / vtt, and the text cut for a talker."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omni.v1 import stages_pb2

from services.common.errors import OmniError
from services.gateway.audio.files import FORMATS, SpeechFile
from services.gateway.audio.protocol import transcript_body
from services.models.profile import LimitsSpec, load_profile
from services.pipeline.media import audio_file
from services.pipeline.speaking import _spoken_pieces

RATE = 24_000


def _tone(seconds: float, freq: float = 440.0) -> bytes:
    t = np.arange(int(seconds * RATE)) / RATE
    return (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()


def _written(fmt: str, pcm: bytes, cuts: list[int], speed: float = 1.0) -> bytes:
    f = SpeechFile(fmt, speed)
    edges = [0, *sorted(c * 2 for c in cuts if 0 < c * 2 < len(pcm)), len(pcm)]
    return b"".join(f.push(pcm[a:b]) for a, b in zip(edges, edges[1:], strict=False)) + f.close()


def _samples(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as f:
        return np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, RATE), max_size=6))
def test_lossless_files_decode_to_the_samples_pushed_however_they_were_cut(cuts):
    pcm = _tone(1.0)
    assert _written("pcm", pcm, cuts) == pcm
    for fmt in ("wav", "flac"):
        assert _samples(_written(fmt, pcm, cuts)).astype("<i2").tobytes() == pcm


@pytest.mark.parametrize("fmt", sorted(set(FORMATS) - {"pcm"}))
def test_every_format_is_a_file_ffmpeg_reads_at_its_length(fmt):
    data = _written(fmt, _tone(2.0), [4800 * k for k in range(1, 10)])
    assert abs(len(_samples(data)) / (48_000 if fmt == "opus" else RATE) - 2.0) < 0.1


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_changes_the_length_by_its_inverse(speed):
    out = _written("pcm", _tone(2.0), [RATE // 2, RATE], speed)
    assert len(out) / 2 / RATE == pytest.approx(2.0 / speed, rel=0.03)


def test_a_wav_file_streams_with_the_placeholder_size():
    data = _written("wav", _tone(0.5), [])
    assert data[4:8] == b"\xff\xff\xff\xff"  # the RIFF size of a stream written before its end


def _encoded(fmt: str, seconds: float) -> bytes:
    return _written(fmt, _tone(seconds), [])


def test_an_upload_is_decoded_to_16_khz_mono_within_the_limits():
    limits = LimitsSpec(max_audio_seconds=3.0)
    for fmt in ("mp3", "flac", "opus", "aac"):
        clip = audio_file(_encoded(fmt, 2.0), limits, param="file")
        assert clip.rate == 16_000 and abs(clip.seconds - 2.0) < 0.1
    assert audio_file(_encoded("wav", 2.0), limits, param="file").rate == RATE  # WAV: read on use
    with pytest.raises(OmniError) as e:
        audio_file(_encoded("flac", 4.0), limits, param="file")
    assert e.value.status == 413 and e.value.code == "audio_too_long"


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00" * 1000, b"ID3" + b"\x01" * 500, b"fLaC" + b"\xff" * 300],
    ids=["empty", "zeros", "id3-only", "flac-garbage"],
)
def test_an_upload_that_is_not_audio_is_a_400(data):
    with pytest.raises(OmniError) as e:
        audio_file(data, LimitsSpec(), param="file")
    assert e.value.status == 400 and e.value.param == "file"


def test_an_image_is_not_an_audio_upload():
    from tests.conftest import png_bytes

    with pytest.raises(OmniError) as e:
        audio_file(png_bytes(), LimitsSpec(), param="file")
    assert e.value.status == 400


def test_an_upload_over_the_byte_limit_is_a_413():
    with pytest.raises(OmniError) as e:
        audio_file(b"\x00" * 2048, LimitsSpec(max_audio_bytes=1024), param="file")
    assert e.value.status == 413


SEGMENTS = [
    stages_pb2.TranscribedSegment(start=0.0, end=1.5, text="Hello there.", language="en"),
    stages_pb2.TranscribedSegment(start=3661.25, end=3662.0, text="An hour on.", language="en"),
]


def test_transcripts_render_as_openai_writes_them():
    body, _ = transcript_body("json", SEGMENTS, 3662.0)
    assert body == {"text": "Hello there. An hour on.", "usage": {"type": "duration", "seconds": 3662.0}}
    srt, media_type = transcript_body("srt", SEGMENTS, 3662.0)
    assert media_type == "application/x-subrip"
    assert (
        srt
        == "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n2\n01:01:01,250 --> 01:01:02,000\nAn hour on.\n"
    )
    vtt, _ = transcript_body("vtt", SEGMENTS, 3662.0)
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n")
    verbose, _ = transcript_body("verbose_json", SEGMENTS, 3662.0)
    assert [s["id"] for s in verbose["segments"]] == [0, 1] and verbose["language"] == "en"
    assert transcript_body("text", [], 1.0)[0] == "\n"


def test_text_for_a_talker_is_cut_at_clauses_and_loses_nothing():
    profile = load_profile("tiny")
    text = (
        "Hello there. This is a test of the speech endpoint, spoken in several pieces; and more words follow"
    )
    pieces = _spoken_pieces(text, profile)
    assert "".join(pieces) == text
    # a piece closes at the first clause boundary once it has chunk_min_tokens words (4 on tiny)
    assert pieces == [
        "Hello there. This is a test of the speech endpoint, ",
        "spoken in several pieces; ",
        "and more words follow",
    ]
