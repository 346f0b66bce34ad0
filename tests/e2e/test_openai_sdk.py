"""The official OpenAI SDK against the running tiny deployment: text, image and speech in;
streamed and non-streamed text and speech out."""

from __future__ import annotations

import base64
import io

import numpy as np
import soundfile

from services.models.profile import load_profile
from tests.conftest import collect_audio, data_url, png_bytes, wav_bytes

OPENAI_PCM_RATE = 24000


def test_text_non_streamed(openai_client, model_name):
    r = openai_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Hello there"}], max_tokens=12, temperature=0
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.usage.completion_tokens == 12
    assert r.choices[0].finish_reason == "length"
    # Greedy decoding through prefill -> NIXL -> decode is deterministic.
    again = openai_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Hello there"}], max_tokens=12, temperature=0
    )
    assert again.choices[0].message.content == r.choices[0].message.content


def test_text_streamed(openai_client, model_name):
    stream = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert len([p for p in pieces if p]) > 1
    assert finish == "length"
    assert usage.completion_tokens == 20
    whole = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=20,
        temperature=0,
    )
    assert "".join(pieces) == whole.choices[0].message.content


def test_streamed_audio_out(openai_client, model_name):
    stream = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Say something"}],
        max_tokens=24,
        temperature=0,
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "pcm16"},
        stream=True,
    )
    audio = collect_audio(stream)
    pcm, transcript, rates = audio.pcm, audio.transcript, audio.rates
    assert rates == {OPENAI_PCM_RATE}
    assert len(pcm) % 2 == 0
    samples = np.frombuffer(pcm, dtype="<i2")
    # The tiny talker emits 2 units (40 ms) per character of transcript.
    assert transcript
    assert len(samples) == len(transcript.encode()) * 2 * 480
    assert np.abs(samples).max() > 0


def test_non_streamed_wav_out(openai_client, model_name):
    r = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Read this aloud"}],
        max_tokens=16,
        temperature=0,
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "wav"},
    )
    audio = r.choices[0].message.audio
    assert audio.transcript
    wave, rate = soundfile.read(io.BytesIO(base64.b64decode(audio.data)), dtype="int16")
    assert rate == OPENAI_PCM_RATE
    assert len(wave) == len(audio.transcript.encode()) * 2 * 480


def test_image_input(openai_client, model_name):
    r = openai_client.chat.completions.create(
        model=model_name,
        max_tokens=8,
        temperature=0,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this image?"},
                    {"type": "image_url", "image_url": {"url": data_url(png_bytes())}},
                ],
            }
        ],
    )
    assert r.choices[0].message.content
    # 64 image embeddings replace the image part in the prompt.
    text_only = openai_client.chat.completions.create(
        model=model_name, max_tokens=1, messages=[{"role": "user", "content": "What is in this image?\n"}]
    )
    assert r.usage.prompt_tokens == text_only.usage.prompt_tokens + 64


def test_speech_input(openai_client, model_name):
    wav = base64.b64encode(wav_bytes(seconds=2.0, rate=22050)).decode()
    r = openai_client.chat.completions.create(
        model=model_name,
        max_tokens=8,
        temperature=0,
        messages=[
            {
                "role": "user",
                "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}],
            }
        ],
    )
    assert r.choices[0].message.content
    assert r.usage.prompt_tokens > 40  # 2 s of audio -> 50 embeddings


def test_models_endpoint_lists_the_model_and_its_openai_names(openai_client, model_name):
    cards = [m.model_dump() for m in openai_client.models.list().data]
    assert [c["id"] for c in cards] == [model_name, *load_profile("tiny").aliases.models]
    assert "gpt-realtime" in [c["id"] for c in cards] and {c["root"] for c in cards} == {model_name}
    assert cards[0]["voices"][0] == "default" and {"alloy", "marin"} <= set(cards[0]["voices"])


def test_openai_model_and_voice_names_work(openai_client):
    """An SDK left at OpenAI's defaults: the model and voice names are the profile's aliases."""
    stream = openai_client.chat.completions.create(
        model="gpt-4o-audio-preview",
        messages=[{"role": "user", "content": "Say something"}],
        max_tokens=8,
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        stream=True,
    )
    audio = collect_audio(stream)
    assert audio.rates == {OPENAI_PCM_RATE} and audio.pcm and audio.transcript


def test_document_streams_encoder_progress_the_sdk_skips(openai_client, model_name):
    """A document (4+ images) streams progress chunks (no choices, `omniray_progress`) while its
    tiles are encoded; the SDK yields them as choice-less chunks, like the usage chunk."""
    pages = [
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(256, 256, seed=100 + i))}}
        for i in range(5)
    ]
    stream = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Summarize"}, *pages]}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    progress, text, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            if (p := (chunk.model_extra or {}).get("omniray_progress")) is not None:
                progress.append(p)
            continue
        text.append(chunk.choices[0].delta.content or "")
    assert progress, "no progress events"
    last = progress[-1]
    assert last["stage"] == "encoder" and last["tiles_total"] == 5 * 4
    assert last["tiles_done"] == last["tiles_total"] and last["images_done"] == 5
    assert [p["tiles_done"] for p in progress] == sorted(p["tiles_done"] for p in progress)
    # the answer streams after them (sampled from random weights, its 4 tokens may decode to no
    # text: incomplete UTF-8 bytes; so the tokens are counted, not the text)
    assert text and 1 <= usage.completion_tokens <= 4
