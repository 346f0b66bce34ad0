"""The `small` profile (real models on CPU) through the official OpenAI SDK: asked in text and
by voice, it answers with the right fact."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest
from openai import OpenAI

from tests.conftest import local_cluster

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def small():
    with local_cluster("small") as cluster:
        yield OpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused", timeout=300, max_retries=0)


def _ask(client, content):
    r = client.chat.completions.create(
        model="omniray-small", messages=[{"role": "user", "content": content}], temperature=0, max_tokens=40
    )
    return r.choices[0].message.content


def test_text_question_is_answered_correctly(small):
    assert "Paris" in _ask(small, QUESTION)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (apt) to speak the question")
def test_spoken_question_is_answered_correctly(small, tmp_path):
    wav = tmp_path / "q.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), QUESTION], check=True)
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav.read_bytes()).decode(), "format": "wav"},
    }
    assert "Paris" in _ask(small, [part])


def test_speech_out_is_a_clear_error_until_the_talker_lands(small):
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="no speech output"):
        small.chat.completions.create(
            model="omniray-small", messages=[{"role": "user", "content": "hi"}], modalities=["text", "audio"]
        )


def test_photo_answer_mentions_what_mobilenet_recognized(small):
    import matplotlib
    from PIL import Image

    from tests.conftest import data_url

    photo = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    # MobileNetV2's top labels for this photo are military uniform, bow tie, graduation cap.
    assert Image.open(photo).format == "JPEG"
    answer = _ask(
        small,
        [
            {"type": "text", "text": "What is in this photo?"},
            {"type": "image_url", "image_url": {"url": data_url(photo.read_bytes(), "image/jpeg")}},
        ],
    )
    assert any(label in answer.lower() for label in ("uniform", "bow tie", "graduation")), answer
