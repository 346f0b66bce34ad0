"""espeak-ng phonemes for the Piper voice, with the text on stdin.

streaming-vits' `Phonemizer` runs `espeak-ng ... <text>`: text the model generated that starts with
`-` is then an option to espeak-ng (`-f/etc/passwd` makes it read and speak a file). Here the text
goes on stdin, never on the command line; the sentence splitting and the phoneme-id layout stay the
library's.
"""

from __future__ import annotations

import subprocess

from streaming_vits import phonemize

ESPEAK_TIMEOUT_S = 30.0


class StdinPhonemizer(phonemize.Phonemizer):
    def _espeak_cli(self, text: str) -> list[str]:
        cmd = ["espeak-ng", "-q", "--ipa", "-v", self.voice, "--stdin"]
        if self.espeak_path:
            cmd += ["--path", self.espeak_path]
        out = subprocess.run(
            cmd, input=text, capture_output=True, text=True, check=True, timeout=ESPEAK_TIMEOUT_S
        ).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]
