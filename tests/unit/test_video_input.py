"""Video clips and PDFs checked from their headers (services/pipeline/video_input.py, documents.py)
and decoded by the pre-stage's sampler (services/stages/video.py): what passes, what is refused with
which code, before anything is decoded."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from omni.v1 import stages_pb2

from loadtest.clients.clips import pdf_document, video_clip
from services.common.errors import OmniError
from services.models.profile import LimitsSpec
from services.pipeline.documents import file_data
from services.pipeline.documents import pdf_document as read_pdf
from services.pipeline.video_input import video_input
from services.stages.video import Refused, sample_clip
from tests.conftest import png_bytes

LIMITS = LimitsSpec(
    max_video_seconds=60, max_video_side_px=1920, max_video_frames=1200, max_video_decode_pixels=200_000_000
)


def _refused(fn, *args, **kw) -> OmniError:
    with pytest.raises(OmniError) as e:
        fn(*args, **kw)
    assert e.value.status in (400, 413)
    return e.value


@pytest.mark.parametrize("container", ["mp4", "webm", "mov"])
def test_a_clip_is_read_from_its_packets(container):
    clip = video_clip(seconds=2.0, fps=10, size=(96, 64), container=container, audio_hz=440)
    v = video_input(clip, LIMITS, with_audio=True, param="p")
    assert (v.width, v.height, v.frames) == (96, 64, 20)
    assert v.seconds == pytest.approx(2.0, abs=0.11)
    assert v.track is not None and v.track.seconds == pytest.approx(2.0, abs=0.1)
    assert video_input(clip, LIMITS, with_audio=False, param="p").track is None


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (png_bytes(), "invalid_video"),
        (b"", "invalid_video"),
        (b"\x00\x00\x00\x18ftypmp42" + bytes(64), "invalid_video"),
        (video_clip(container="mp4")[:300], "invalid_video"),
        (pdf_document(1), "invalid_video"),
    ],
)
def test_what_is_not_a_readable_clip_is_a_400(data, code):
    assert _refused(video_input, data, LIMITS, with_audio=False, param="p").code == code


def test_bounds_are_checked_before_decoding():
    wide = video_clip(seconds=0.2, fps=5, size=(1936, 16))
    assert _refused(video_input, wide, LIMITS, with_audio=False, param="p").code == "video_too_large"
    many = video_clip(seconds=12.1, fps=100, size=(16, 16), motion="static")
    assert _refused(video_input, many, LIMITS, with_audio=False, param="p").code == "video_too_long"
    heavy = video_clip(seconds=7.0, fps=100, size=(640, 480), motion="static")
    assert _refused(video_input, heavy, LIMITS, with_audio=False, param="p").code == "video_too_large"
    long = video_clip(seconds=61, fps=1, size=(16, 16), motion="static")
    assert _refused(video_input, long, LIMITS, with_audio=False, param="p").code == "video_too_long"
    big = bytes(LIMITS.max_video_bytes + 1)
    assert _refused(video_input, big, LIMITS, with_audio=False, param="p").code == "video_too_large"


def _request(**kw) -> stages_pb2.VideoRequest:
    args = dict(fps=2, max_frames=16, keyframe_threshold=0.02, frame_px=128, frame_multiple=32, seconds=2)
    return stages_pb2.VideoRequest(**{**args, **kw})


@pytest.mark.parametrize("container", ["mp4", "webm"])
def test_key_frames_drop_a_static_scene_and_keep_motion(container):
    static = video_clip(seconds=4, fps=10, size=(160, 120), container=container, motion="static")
    moving = video_clip(seconds=4, fps=10, size=(160, 120), container=container, motion="moving")
    frames, times, sampled, track = sample_clip(static, _request(seconds=4))
    assert len(frames) == 1 and sampled >= 7 and track is None
    frames, times, sampled, _ = sample_clip(moving, _request(seconds=4))
    assert len(frames) == sampled >= 7
    assert times == sorted(times) and frames.shape[1:] == (96, 128, 3) and frames.dtype == np.uint8


def test_the_audio_track_comes_at_16k():
    clip = video_clip(seconds=2, fps=10, audio_hz=440)
    *_, track = sample_clip(clip, _request(with_audio=True))
    assert abs(len(track) - 32000) < 2000 and track.dtype == np.float32 and np.abs(track).max() > 0.1


def test_damage_past_the_header_is_a_refusal_not_a_failure():
    clip = bytearray(video_clip(seconds=2, fps=10, container="webm"))
    clip[len(clip) // 3 :] = bytes(len(clip) - len(clip) // 3)
    try:
        frames, *_ = sample_clip(bytes(clip), _request())
        assert len(frames) >= 1
    except Refused as e:
        assert e.code == "invalid_video"


def test_a_pdf_is_its_pages_rendered_on_use():
    doc = read_pdf(pdf_document(3), LimitsSpec(), param="p")
    assert len(doc.pages) == 3
    page = doc.pages[1]
    assert (page.width, page.height) == (918, 1188)  # 612 x 792 pt at 108 dpi
    pixels = page.pixels()
    assert pixels.shape == (1188, 918, 3) and pixels.min() < 100 < pixels.max()
    assert len({p.content_hash for p in doc.pages}) == 3


def test_a_huge_page_renders_at_the_page_limit():
    doc = read_pdf(pdf_document(1, size=(14400, 7200)), LimitsSpec(max_pdf_page_px=1024), param="p")
    assert (doc.pages[0].width, doc.pages[0].height) == (1024, 512)


ENCRYPTED = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\n"
    b"3 0 obj<</Filter/Standard/V 1/R 2/O(" + bytes(32) + b")/U(" + bytes(32) + b")/P -4>>endobj\n"
    b"trailer<</Root 1 0 R/Encrypt 3 0 R/ID[<00112233445566778899aabbccddeeff><00112233445566778899aabbccddeeff>]>>\n%%EOF"
)
NO_PAGES = b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (png_bytes(), "invalid_file"),
        (b"%PDF-1.7\n" + bytes(100), "invalid_file"),
        (pdf_document(2)[:400], "invalid_file"),
        (ENCRYPTED, "encrypted_pdf"),
        (NO_PAGES, "invalid_file"),
        (pdf_document(4), "file_too_large"),
        (bytes(LimitsSpec().max_pdf_bytes + 1), "file_too_large"),
    ],
)
def test_what_is_not_a_readable_pdf_is_a_400(data, code):
    assert _refused(read_pdf, data, LimitsSpec(max_pdf_pages=3), param="p").code == code


def test_file_data_is_a_data_url_or_bare_base64():
    raw = pdf_document(1)
    b64 = base64.b64encode(raw).decode()
    assert file_data(b64, LimitsSpec(), param="p") == raw
    assert file_data(f"data:application/pdf;base64,{b64}", LimitsSpec(), param="p") == raw
    assert _refused(file_data, "not base64!", LimitsSpec(), param="p").code == "invalid_base64"
    assert _refused(file_data, 12, LimitsSpec(), param="p").code == "invalid_request"
