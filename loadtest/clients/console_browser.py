"""The voice console (/console) in a real browser: Debian's chromium, headless, driven by
Playwright, with a fake microphone that plays a WAV file (in a loop, as Chromium does). The
browser test and the screenshot in docs/images come from here; by hand:

    python -m loadtest.clients.console_browser --url http://127.0.0.1:8000 --say "What is the capital of France?" \\
        --screenshot docs/images/console.png
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf

from loadtest.clients.speech import RATE, speech
from services.quota import LOCAL_API_KEY
from services.realtime.server_events import WHOLE

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Chromium on a machine without a screen or network (the probe's flags), plus a microphone that
# plays a file and a page allowed to use it and to play sound without a click.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--use-fake-ui-for-media-stream",
         "--use-fake-device-for-media-stream", "--autoplay-policy=no-user-gesture-required"]  # fmt: skip


def question_wav(path: Path, text: str, silence_s: float, lead_s: float = 0.0) -> Path:
    """`lead_s` of silence, `text` spoken, then `silence_s` of silence (the fake microphone plays from
    the page's getUserMedia, before the call is up, and loops the file: the question comes again
    after the silence, over the answer if it is still playing — a barge-in)."""
    lead, tail = (bytes(int(seconds * RATE) * 2) for seconds in (lead_s, silence_s))
    pcm = np.frombuffer(lead + speech(text) + tail, "<i2")
    sf.write(path, pcm, RATE, subtype="PCM_16")
    return path


@contextlib.contextmanager
def console(
    url: str,
    wav: Path,
    key: str = LOCAL_API_KEY,
    max_tokens: int = 200,
    instructions: str = "",
    camera: Path | None = None,
) -> Iterator:
    """The console page, connected (a call up and its session created), talking from `wav`; with
    `camera` (a .y4m file, looped by Chromium's fake camera), showing it too."""
    from playwright.sync_api import sync_playwright

    args = [*FLAGS, f"--use-file-for-fake-audio-capture={wav}"]
    if camera is not None:
        args.append(f"--use-file-for-fake-video-capture={camera}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.goto(f"{url}/console")
            page.locator("#model option").first.wait_for(state="attached")
            page.fill("#key", key)
            page.fill("#max-tokens", str(max_tokens))
            if instructions:
                page.fill("#instructions", instructions)
            if camera is not None:
                page.check("#camera")
            page.click("#connect")
            page.wait_for_selector('#status[data-state="connected"]', timeout=60_000)
            yield page
        finally:
            browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--key", default=LOCAL_API_KEY)
    ap.add_argument("--say", default="What is the capital of France?")
    ap.add_argument(
        "--silence", type=float, default=20.0, help="seconds after the question before it repeats"
    )
    ap.add_argument("--max-tokens", type=int, default=60)
    ap.add_argument("--instructions", default="")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for a completed turn")
    ap.add_argument("--screenshot", type=Path, required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wav = question_wav(Path(tmp) / "question.wav", args.say, args.silence, lead_s=3.0)
        with console(args.url, wav, args.key, args.max_tokens, args.instructions) as page:
            whole = ", ".join(f'tr[data-status="{status}"][data-played]' for status in WHOLE)
            page.wait_for_selector(whole, timeout=args.timeout * 1000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(args.screenshot))
            print(page.locator("#transcript").inner_text())
            print(page.locator("#turns table").inner_text())


if __name__ == "__main__":
    main()
