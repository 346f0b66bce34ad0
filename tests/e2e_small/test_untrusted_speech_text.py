"""Text the model generates is spoken as words: text that looks like espeak-ng options
(`-f<file>`, `--path=/`) never reaches its command line, so the talker reads no file."""

from __future__ import annotations

import shutil

import pytest

from loadtest.clients.speech import speech
from tests.conftest import load_adapter

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
SECRET = "zebra quartz"  # words whose phonemes appear only if the file is read


@pytest.fixture(scope="module")
def talker():
    return load_adapter("small", "talker")


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text(SECRET)
    return path


def _said(talker, text: str) -> str:
    return "".join(talker.phonemizer.phonemes(text))


@pytest.mark.parametrize("form", ["-f{}", "-f {}", "--stdin {}", "--path={}", "-- -f{}", "-w{}"])
def test_option_like_text_is_spoken_not_obeyed(talker, secret_file, form):
    text = form.format(secret_file)
    said = _said(talker, text)
    secret = _said(talker, SECRET).strip()
    assert secret not in said
    assert _said(talker, "slash").strip() in said  # the path itself is read out, word by word
    assert secret_file.read_text() == SECRET  # `-w<file>` wrote nothing over it


def test_talker_speaks_the_words_of_an_option_like_reply(talker, secret_file):
    frames = list(talker.stream_units(f"-f{secret_file}", "joe"))
    assert sum(len(f) for f in frames) > 0  # spoken, not an error


def test_test_speech_takes_text_on_stdin(secret_file):
    # Obeyed, `-f<file>` would speak the file's two words; spoken, it reads out the whole path.
    assert len(speech(f"-f{secret_file}")) > 2 * len(speech(SECRET))
