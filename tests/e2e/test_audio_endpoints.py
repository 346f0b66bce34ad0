"""The audio endpoints on the tiny deployment with the official SDK and over gRPC: speech in every
format (decoded back by FFmpeg at 24 kHz, `speed` changes its length, streamed as bytes or SSE
events), transcriptions of real speech by the profile's Whisper transcriber in every response format
and streamed, and gRPC server reflection (what `grpcurl` needs without our protos)."""

from __future__ import annotations

import base64
import io
import json
import shutil

import av
import grpc
import httpx
import jiwer
import openai
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from omni.v1 import omni_pb2, omni_pb2_grpc

from loadtest.clients.speech import spoken_wav
from services.quota import LOCAL_API_KEY
from tests.conftest import grpc_channel

SAY = "Hello there. This is a test of the speech endpoint, spoken in several pieces."
QUESTION = "What is the weather like in Paris today?"
needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="needs espeak-ng to speak the input"
)


def _decoded(data: bytes) -> tuple[float, int]:
    """(seconds, sample rate) of an encoded audio file, as FFmpeg reads it."""
    with av.open(io.BytesIO(data)) as f:
        stream = f.streams.audio[0]
        samples = sum(frame.samples for frame in f.decode(stream))
        return samples / stream.rate, stream.rate


def _speech(client, model_name, **kw) -> bytes:
    return client.audio.speech.create(model=model_name, voice="alloy", input=SAY, **kw).read()


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_speech_in_every_format_decodes_at_24_khz(openai_client, model_name, fmt):
    seconds, rate = _decoded(_speech(openai_client, model_name, response_format=fmt))
    assert rate == (48_000 if fmt == "opus" else 24_000) and seconds > 1.0  # Opus always decodes at 48 kHz


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "aac"])
def test_a_whole_chat_answer_comes_as_a_file_of_its_format(openai_client, model_name, fmt):
    r = openai_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
        modalities=["text", "audio"], audio={"voice": "alloy", "format": fmt},
    )  # fmt: skip
    seconds, _ = _decoded(base64.b64decode(r.choices[0].message.audio.data))
    assert seconds > 0.1


def test_speech_pcm_is_the_wav_samples_and_speed_changes_the_length(openai_client, model_name):
    pcm = _speech(openai_client, model_name, response_format="pcm")
    wav_s, _ = _decoded(_speech(openai_client, model_name, response_format="wav"))
    assert len(pcm) % 2 == 0 and abs(len(pcm) / 2 / 24_000 - wav_s) < 0.01
    fast = _speech(openai_client, model_name, response_format="pcm", speed=2.0)
    slow = _speech(openai_client, model_name, response_format="pcm", speed=0.5)
    assert len(fast) / len(pcm) == pytest.approx(0.5, abs=0.05)
    assert len(slow) / len(pcm) == pytest.approx(2.0, abs=0.1)


def test_speech_streams_bytes_and_sse_events(omniray, openai_client, model_name):
    with openai_client.audio.speech.with_streaming_response.create(
        model=model_name, voice="alloy", input=SAY, response_format="pcm"
    ) as r:
        assert r.headers["content-type"] == "audio/pcm"
        chunks = list(r.iter_bytes())
    assert len(chunks) >= 2  # several pieces, sent as they are made
    body = {"model": model_name, "input": SAY, "response_format": "pcm", "stream_format": "sse"}
    r = httpx.post(
        f"{omniray.http_url}/v1/audio/speech", json=body, headers={"authorization": f"Bearer {LOCAL_API_KEY}"}, timeout=120
    )  # fmt: skip
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["input_tokens"] > 0


@pytest.mark.parametrize(
    ("kw", "status", "param"),
    [
        ({"instructions": "whisper it"}, 400, "instructions"),  # the tiny talker takes none
        ({"voice": "nobody"}, 400, "voice"),
        ({"input": " "}, 400, "input"),
        ({"input": "x" * 4097}, 422, "input"),
        ({"speed": 5.0}, 422, "speed"),
        ({"response_format": "ogg"}, 422, "response_format"),
        ({"model": "gpt-nothing"}, 400, "model"),
    ],
)
def test_speech_refuses_what_it_cannot_honour(openai_client, model_name, kw, status, param):
    args = {"model": model_name, "voice": "alloy", "input": SAY, **kw}
    with pytest.raises(openai.APIStatusError) as e:
        openai_client.audio.speech.create(**args).read()
    assert e.value.status_code == status and e.value.body["param"] == param


@pytest.fixture(scope="module")
def spoken():
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng to speak the question")
    return spoken_wav(QUESTION)


def _words(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c == " ").split())


def test_transcription_of_real_speech_in_every_response_format(openai_client, model_name, spoken):
    text = openai_client.audio.transcriptions.create(model=model_name, file=("q.wav", spoken))
    assert _words(text.text) == _words(QUESTION)
    verbose = openai_client.audio.transcriptions.create(
        model=model_name, file=("q.wav", spoken), response_format="verbose_json", timestamp_granularities=["segment"]
    )  # fmt: skip
    assert verbose.language == "en" and verbose.duration > 1.0 and verbose.segments
    assert 0 <= verbose.segments[0].start < verbose.segments[-1].end <= verbose.duration + 0.1
    plain = openai_client.audio.transcriptions.create(
        model=model_name, file=("q.wav", spoken), response_format="text"
    )
    assert _words(plain) == _words(QUESTION)
    srt = openai_client.audio.transcriptions.create(
        model=model_name, file=("q.wav", spoken), response_format="srt"
    )
    assert srt.startswith("1\n00:00:0") and " --> " in srt
    vtt = openai_client.audio.transcriptions.create(
        model=model_name, file=("q.wav", spoken), response_format="vtt"
    )
    assert vtt.startswith("WEBVTT\n\n00:00:0")


def test_a_compressed_upload_is_transcribed_and_streamed(omniray, openai_client, model_name, spoken):
    buf = io.BytesIO()
    with av.open(io.BytesIO(spoken)) as src, av.open(buf, "w", format="mp3") as dst:
        out = dst.add_stream("libmp3lame", rate=src.streams.audio[0].rate, layout="mono")
        out.bit_rate = 128_000
        for frame in src.decode(audio=0):
            frame.pts = None
            for packet in out.encode(frame):
                dst.mux(packet)
        for packet in out.encode(None):
            dst.mux(packet)
    stream = openai_client.audio.transcriptions.create(
        model=model_name, file=("q.mp3", buf.getvalue()), stream=True
    )
    events = list(stream)
    # an MP3 of espeak's voice is harder for Whisper tiny than the WAV: a word may go astray
    assert events[-1].type == "transcript.text.done"
    assert jiwer.wer(_words(QUESTION), _words(events[-1].text)) <= 0.25, events[-1].text
    assert all(e.type == "transcript.text.delta" for e in events[:-1]) and events[:-1]


@pytest.mark.parametrize(
    ("files", "data", "status", "param"),
    [
        ({"file": ("x.mp3", b"not audio at all" * 100)}, {}, 400, "file"),
        ({"attachment": ("a.txt", b"text")}, {}, 400, "file"),
        ({"file": ("x.wav", b"")}, {}, 400, "file"),
        (
            None,
            {"timestamp_granularities[]": "word", "response_format": "verbose_json"},
            400,
            "timestamp_granularities",
        ),
        (None, {"language": "fr"}, 400, "language"),
        (None, {"response_format": "srt", "stream": "true"}, 400, "stream"),
        (None, {"temperature": "7"}, 422, "temperature"),
        (None, {"include[]": "logprobs"}, 400, "include"),
    ],
)
def test_transcription_refusals(omniray, model_name, spoken, files, data, status, param):
    files = {"file": ("q.wav", spoken)} if files is None else files
    r = httpx.post(
        f"{omniray.http_url}/v1/audio/transcriptions",
        files=files or None,
        data={"model": model_name, **data},
        headers={"authorization": f"Bearer {LOCAL_API_KEY}"},
        timeout=60,
    )
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_a_transcription_that_is_not_a_form_is_refused(omniray, model_name):
    r = httpx.post(
        f"{omniray.http_url}/v1/audio/transcriptions",
        json={"model": model_name},
        headers={"authorization": f"Bearer {LOCAL_API_KEY}"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content_type"


@pytest.fixture(scope="module")
def stub(omniray):
    channel = grpc_channel(omniray.grpc_target)
    yield omni_pb2_grpc.OmniStub(channel)
    channel.close()


def test_grpc_speech_and_transcription(stub, model_name, spoken):
    chunks = list(stub.Speech(omni_pb2.SpeechRequest(model=model_name, input=SAY, response_format="flac")))
    assert chunks[0].content_type == "audio/flac" and chunks[-1].usage.prompt_tokens > 0
    assert chunks[-1].usage.output_audio_seconds > 1.0
    seconds, rate = _decoded(b"".join(c.audio for c in chunks))
    assert rate == 24_000 and seconds == pytest.approx(chunks[-1].usage.output_audio_seconds, abs=0.05)
    out = list(stub.Transcribe(omni_pb2.TranscriptionRequest(model=model_name, file=spoken)))
    assert out[-1].HasField("text") and _words(out[-1].text) == _words(QUESTION)
    assert all(c.HasField("segment") for c in out[:-1]) and out[-1].usage.input_audio_seconds > 1.0
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Transcribe(omni_pb2.TranscriptionRequest(model=model_name, file=b"garbage" * 10)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_grpc_server_reflection_lists_and_describes_the_api(omniray):
    """What grpcurl does with no .proto files: list services, resolve a method's message types."""
    channel = grpc.insecure_channel(omniray.grpc_target)
    try:
        db = ProtoReflectionDescriptorDatabase(channel)
        assert "omni.v1.Omni" in db.get_services()
        service = db.FindFileContainingSymbol("omni.v1.Omni")
        assert service.name == "omni/v1/omni.proto"
        from google.protobuf.descriptor_pool import DescriptorPool

        pool = DescriptorPool(db)
        methods = {m.name: m for m in pool.FindServiceByName("omni.v1.Omni").methods}
        assert {"Chat", "Realtime", "Speech", "Transcribe"} <= set(methods)
        assert methods["Speech"].input_type.full_name == "omni.v1.SpeechRequest"
    finally:
        channel.close()


def test_chat_usage_counts_the_audio_in_the_prompt(openai_client, model_name):
    from tests.conftest import wav_bytes

    clip = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav_bytes(2.0)).decode(), "format": "wav"},
    }
    heard = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, clip]}],
        max_tokens=2,
    )
    read = openai_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    audio = heard.usage.prompt_tokens_details.audio_tokens
    # the clip's rows, and the text around them (a "\n")
    assert 0 < audio <= heard.usage.prompt_tokens - read.usage.prompt_tokens
    assert read.usage.prompt_tokens_details.audio_tokens == 0
