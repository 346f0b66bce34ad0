"""The voice console in a real browser (Debian's chromium, headless, Playwright) on the tiny
deployment: the page connects over WebRTC with a client secret it mints, a spoken question (a fake
microphone playing a WAV) is answered with audio, and the question coming again over the answer
(the file loops) is a barge-in that cuts it."""

from __future__ import annotations

import shutil

import pytest

from loadtest.clients.console_browser import CHROMIUM, console, question_wav

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
