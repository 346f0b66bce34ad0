"""The voice console in a real browser (Debian's chromium, headless, Playwright) on the tiny
deployment: the page connects over WebRTC with a client secret it mints, a spoken question (a fake
microphone playing a WAV) is answered with audio, and the question coming again over the answer
(the file loops) is a barge-in that cuts it."""

from __future__ import annotations

import shutil
import time

import pytest

from loadtest.clients.clips import video_clip
from loadtest.clients.console_browser import CHROMIUM, console, question_wav
from tests.faults import counter


def _eventually(check, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(1)


pytestmark = [
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="needs chromium (make system-deps)"),
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng to speak"),
]


def test_the_console_answers_a_spoken_question_and_a_barge_in_cuts_the_reply(omniray, tmp_path):
    wav = question_wav(tmp_path / "question.wav", "What is the weather like in Paris today?", silence_s=3.0)
    with console(omniray.http_url, wav, max_tokens=400) as page:
        answered = page.wait_for_selector("tr[data-ttfp]", timeout=90_000)  # its answer's audio played
        assert 0 < int(answered.get_attribute("data-ttfp")) < 30_000
        page.wait_for_selector('tr[data-status="cut"]', timeout=90_000)  # the question again, over it
        page.wait_for_selector("#transcript li.assistant.cut", timeout=10_000)
        # the interrupting question is a turn of its own
        page.locator("#transcript li.user").nth(1).wait_for(timeout=30_000)
        # what was said, as the session's transcriber (a real small Whisper) heard it
        heard = page.locator("#transcript li.user", has_text="Paris").first
        heard.wait_for(timeout=60_000)
        assert page.locator("#transcript li.assistant").first.inner_text().strip()
        assert page.locator("#log li.error").count() == 0, page.locator("#log").inner_text()
        page.screenshot(path=str(tmp_path / "console.png"))


def test_the_console_shows_the_camera_while_the_question_is_spoken(omniray, tmp_path):
    """Chromium's fake camera (a scene cut every 2 s) streams video during a spoken question: the
    turn that follows carries the key frames the session held, and they reach the encoder."""
    wav = question_wav(tmp_path / "question.wav", "What am I showing you?", silence_s=20.0, lead_s=1.0)
    y4m = tmp_path / "camera.y4m"
    y4m.write_bytes(video_clip(seconds=6, fps=5, size=(320, 240), container="y4m", motion="cuts"))
    tiles = counter(omniray.metrics_url, "omniray_encoder_tiles_total")
    with console(omniray.http_url, wav, max_tokens=20, camera=y4m) as page:
        turn = page.wait_for_selector("#transcript li.user[data-frames]", timeout=90_000)
        assert 1 <= int(turn.get_attribute("data-frames")) <= 4  # tiny's camera window
        page.wait_for_selector("tr[data-ttfp]", timeout=90_000)  # answered
        assert page.locator("#log li.error").count() == 0, page.locator("#log").inner_text()
    # Ray exports metrics every few seconds
    _eventually(
        lambda: counter(omniray.metrics_url, "omniray_realtime_camera_frames_total", outcome="joined") >= 1,
        30,
    )
    _eventually(lambda: counter(omniray.metrics_url, "omniray_encoder_tiles_total") > tiles, 30)
