"""`qwen3-omni-tiny` through Serve — the GPU profile's stages, engine arguments and KV hand-off with
the real Qwen3-Omni at a tiny size: the official `openai` SDK streams an answer to text, an image and
speech (the model's own encoders in the encoder pool, their outputs placed by vLLM's thinker), a long
multimodal prompt goes through prefill -> decode over the KV store and is found there the next time,
gRPC Chat answers, and speech streams from the model's talker and code2wav, for text prompts and for
images and speech in (the thinker's hidden states at the media handed from vLLM's workers)."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.request

import numpy as np
import openai
import pytest
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc
from openai import OpenAI

from services.models.profile import load_profile
from services.quota import LOCAL_API_KEY
from services.realtime.server_events import WHOLE
from tests.conftest import collect_audio, data_url, grpc_channel, local_cluster, png_bytes, wav_bytes
from tests.dashboards import REALTIME_POOL_SERIES
from tests.faults import RECOVER_S, Outcome, counter, kill, replica_pid, rest_stream, resumes

MODEL = "qwen3-omni-tiny"
# The talker samples (as the model's generate does) and random weights draw the codec's end now and
# then, at the first code too (an answer without speech, correct for these weights): speech tests
# seed the request so the talker's draws are the same every run.
SPEECH_SEED = 1


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(MODEL) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    return OpenAI(base_url=f"{cluster.http_url}/v1", api_key=LOCAL_API_KEY, timeout=120, max_retries=0)


def test_the_sdk_streams_an_answer(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is in Paris?"},
        ],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = next(c.usage for c in chunks if c.usage)
    assert text and usage.completion_tokens == 16 and usage.prompt_tokens > 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]


def test_grpc_chat_answers(cluster):
    stub = omni_pb2_grpc.OmniStub(grpc_channel(cluster.grpc_target))
    request = omni_pb2.ChatRequest(
        model=MODEL,
        messages=[omni_pb2.Message(role="user", content=[omni_pb2.ContentPart(text="hello")])],
        sampling=common_pb2.SamplingParams(max_tokens=8),
    )
    chunks = list(stub.Chat(request, timeout=120))
    assert "".join(c.text for c in chunks) and chunks[-1].finish_reason == "length"


def _media_question(image: bytes, detail: str = "auto") -> list[dict]:
    speech = base64.b64encode(wav_bytes(seconds=1.5)).decode()
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is in the picture, and what do you hear?"},
            {"type": "image_url", "image_url": {"url": data_url(image), "detail": detail}},
            {"type": "input_audio", "input_audio": {"data": speech, "format": "wav"}},
        ]},
    ]  # fmt: skip


def _answer(client, messages, **extra):
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, **extra,
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, next(c.usage for c in chunks if c.usage)


def test_the_sdk_sends_text_an_image_and_speech(client):
    text, usage = _answer(client, _media_question(png_bytes(width=300, height=200, seed=11)))
    # image: the processor's grid for 300x200 within one tile; audio: 13 tokens a second
    assert text and usage.completion_tokens == 12 and usage.prompt_tokens > 60 + 19


def test_a_long_multimodal_prompt_goes_through_prefill_and_the_kv_store(client):
    """A 2x2-tile image (4 x 196 tokens) passes disagg_min_prompt_tokens: prefill computes the KV,
    decode loads it from the store; asked again, the pages are found (vLLM's cached tokens) and the
    greedy answer is the same."""
    messages = _media_question(png_bytes(width=896, height=896, seed=12), detail="high")
    first, u1 = _answer(client, messages)
    again, u2 = _answer(client, messages)
    assert u1.prompt_tokens > 4 * 196 and u2.prompt_tokens == u1.prompt_tokens
    assert again == first
    assert u2.prompt_tokens_details.cached_tokens >= 4 * 196


def test_images_stream_to_the_thinker_over_nixl(cluster, client):
    """The profile streams features (encoder_pool.stream_mib): the prompt goes to the thinker as soon
    as the encoder pool has placed the images, each image's features through the encoder's NIXL
    feature pool (indexed in Redis by its key) to vLLM's EC connector. Same answer asked twice (the
    second time from vLLM's and the store's caches)."""
    import redis

    r = redis.Redis.from_url(cluster.redis_url)
    before = set(r.scan_iter("omniray:ec:item:*"))
    images = [
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(width=320, height=224, seed=40 + n))}}
        for n in range(5)
    ]
    messages = [{"role": "user", "content": [{"type": "text", "text": "Compare them."}, *images]}]
    first, usage = _answer(client, messages)
    again, _ = _answer(client, messages)
    assert len(set(r.scan_iter("omniray:ec:item:*")) - before) == 5
    assert first and again == first and usage.prompt_tokens > 5 * 60


def test_the_sdk_streams_speech_from_the_talker_and_code2wav(client):
    """Text and 24 kHz audio in one stream: the talker reads the thinker's tokens as decode writes
    them (async chunk)."""
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about Paris."}], max_tokens=96,
        temperature=0, seed=SPEECH_SEED, stream=True, modalities=["text", "audio"],
        audio={"voice": "chelsie", "format": "pcm16"},
    )  # fmt: skip
    pcm, rates, transcript = bytearray(), set(), []
    for chunk in stream:
        audio = chunk.choices[0].delta.audio if chunk.choices else None
        if audio:
            audio = audio.model_dump()
            if audio.get("data"):
                pcm += base64.b64decode(audio["data"])
                rates.add(audio["sample_rate"])
            if audio.get("transcript"):
                transcript.append(audio["transcript"])
    assert rates == {24_000} and len(pcm) >= 2 * 1920 * 4  # at least the first chunk's 4 frames
    # (whether audio starts before the last text token depends on the machine's load: the async
    # chunk's gain is measured by `make bench-omni`, TTFP with and without it, not asserted here)
    assert "".join(transcript)


def test_speech_answers_an_image_and_speech(client):
    """With media in, the talker reads the thinker's hidden states at the media (written by vLLM's
    workers, handed over by decode), and a 2x2-tile prompt goes prefill -> decode first: the rows
    come from the prefill engine."""
    for detail, size in (("auto", (300, 200)), ("high", (896, 896))):
        stream = client.chat.completions.create(
            model=MODEL, messages=_media_question(png_bytes(*size, seed=14), detail), max_tokens=24, temperature=0,
            seed=SPEECH_SEED, stream=True, modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"},
        )  # fmt: skip
        audio = collect_audio(stream)
        assert audio.rates == {24_000} and len(audio.pcm) >= 2 * 1920 * 4 and audio.transcript, detail


def test_speech_answers_a_clip_and_its_audio_track_is_heard(client):
    """A clip through the video pre-stage and the model's own vision tower (temporal patches,
    placed as vLLM's video input), answered in speech; with use_audio_in_video its audio track goes
    through the model's audio encoder too (more prompt tokens: the track's)."""
    from loadtest.clients.clips import video_clip

    clip = video_clip(seconds=2, fps=10, size=(128, 96), motion="moving", audio_hz=330)
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "What happens in the video?"},
        {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{base64.b64encode(clip).decode()}"}},
    ]}]  # fmt: skip
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, seed=SPEECH_SEED, stream=True,
        modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"},
    )  # fmt: skip
    audio = collect_audio(stream)
    assert audio.rates == {24_000} and len(audio.pcm) >= 2 * 1920 * 4 and audio.transcript
    _, seen = _answer(client, messages)
    _, heard = _answer(client, messages, extra_body={"mm_processor_kwargs": {"use_audio_in_video": True}})
    assert heard.prompt_tokens > seen.prompt_tokens + 10
    webm = video_clip(seconds=2, fps=10, size=(128, 96), motion="moving", container="webm")
    messages[0]["content"][1]["video_url"]["url"] = (
        f"data:video/webm;base64,{base64.b64encode(webm).decode()}"
    )
    text, in_webm = _answer(client, messages)
    assert text and in_webm.prompt_tokens == seen.prompt_tokens  # the same frames' patches, another container


def test_the_models_voices_are_the_talkers_speakers(client):
    profile = load_profile(MODEL)
    config = json.loads((profile.model_path(profile.models.talker) / "config.json").read_text())
    card = client.models.list().data[0]
    assert card.id == MODEL and card.model_dump()["voices"][:3] == profile.pipeline.voices
    assert sorted(profile.pipeline.voices) == sorted(config["talker_config"]["speaker_id"])


def test_an_unknown_voice_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="unknown voice"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            modalities=["text", "audio"], audio={"voice": "default", "format": "pcm16"},
        )  # fmt: skip


def test_a_realtime_session_sends_raw_audio_into_the_models_audio_encoder(client):
    """Realtime on Qwen3-Omni: the session's audio goes to the model's own audio encoder (no ASR), a
    text answer and then a spoken one, and a second turn sees the first."""
    manual = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, "output_modalities": ["text"]}
    rate = 24_000
    t = np.arange(int(0.8 * rate)) / rate
    speech = base64.b64encode((np.sin(2 * np.pi * 180 * t) * 8000).astype("<i2").tobytes()).decode()

    def until(conn, kind, seen):
        for event in conn:
            seen.append(event)
            if event.type == "error":
                raise AssertionError(event)
            if event.type == kind:
                return event
        raise AssertionError(f"closed before {kind}")

    with client.realtime.connect(model=MODEL) as conn:
        seen: list = []
        until(conn, "session.created", seen)
        conn.session.update(session={**manual, "max_output_tokens": 12})
        until(conn, "session.updated", seen)
        usage = []
        for _ in range(2):
            conn.input_audio_buffer.append(audio=speech)
            conn.input_audio_buffer.commit()
            conn.response.create()
            done = until(conn, "response.done", seen)
            assert done.response.status in WHOLE
            usage.append(done.response.usage.input_tokens)
        text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
        assert text and usage[1] > usage[0] > 13  # 0.8 s of audio: 11 audio tokens and more
        seen.clear()
        speak = {"output_modalities": ["audio"], "max_output_tokens": 16, "omniray": {"seed": SPEECH_SEED}}
        conn.session.update(session={"type": "realtime", **speak})
        until(conn, "session.updated", seen)
        conn.input_audio_buffer.append(audio=speech)
        conn.input_audio_buffer.commit()
        conn.response.create()
        assert until(conn, "response.done", seen).response.status in WHOLE
        assert [e for e in seen if e.type == "response.output_audio.delta"]


def test_audio_speech_feeds_the_talker_the_texts_tokens(client):
    """/v1/audio/speech on the token talker: the input's tokens go to it through a token stream, as
    decode writes an answer's; code2wav's 24 kHz comes back as a file. No transcriber here: 400."""
    import io

    import av
    import openai

    data = client.audio.speech.create(
        model=MODEL, voice="ethan", input="Hello there, how are you?", response_format="wav"
    ).read()
    with av.open(
        io.BytesIO(data)
    ) as f:  # random weights may end the speech at any frame: the file is what is checked
        assert f.streams.audio[0].rate == 24_000
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=MODEL, file=("a.wav", wav_bytes(seconds=1.0)))
    assert e.value.body["param"] == "model" and "no transcription model" in e.value.message


def test_auto_tools_go_through_the_models_tool_parser(client):
    """tool_choice "auto" on Qwen3-Omni: the answer streams through vLLM's hermes parser, content as
    content (and as speech) and any `<tool_call>` as tool_calls; over chat, the Responses API and a
    realtime session. Random weights decide freely: what is checked is that the answer arrives whole
    and consistent with its finish (the parsing itself: tests/unit/test_tool_parser.py)."""
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}}}}}  # fmt: skip
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[weather],
        modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"}, max_tokens=16,
        seed=SPEECH_SEED, stream=True,
    )  # fmt: skip
    chunks = [c for c in stream if c.choices]
    (finish,) = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or ()]
    audio = [getattr(c.choices[0].delta, "audio", None) for c in chunks]
    transcript = "".join(getattr(a, "transcript", None) or "" for a in audio if a is not None)
    assert (calls or transcript) and finish in ("tool_calls", "length") and (finish == "length" or calls)
    answer = client.responses.create(model=MODEL, input="Weather in Paris?", max_output_tokens=16,
                                     tools=[{"type": "function", **weather["function"]}])  # fmt: skip
    kinds = [o.type for o in answer.output]
    assert kinds and (answer.status == "incomplete" or "function_call" in kinds)
    with client.realtime.connect(model=MODEL) as conn:
        tool = {"type": "function", **weather["function"]}
        conn.session.update(session={"type": "realtime", "tools": [tool], "output_modalities": ["text"],
                                     "max_output_tokens": 12, "audio": {"input": {"turn_detection": None}}})  # fmt: skip
        conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}
        )
        conn.response.create()
        for event in conn:
            assert event.type != "error", event
            if event.type == "response.done":
                assert event.response.status in WHOLE and event.response.output
                break


@pytest.fixture(scope="module")
def ray_driver(cluster):
    """This process joined to the test cluster (to find a replica's process)."""
    import ray

    ray.init(address=cluster.ray_address, log_to_driver=False)
    yield
    ray.shutdown()


def _decodes(cluster, stage: str) -> float:
    """Decode calls the stage's replicas finished (`omniray_stage_latency_seconds`, by stage)."""
    return counter(cluster.metrics_url, "omniray_stage_latency_seconds_count", stage=stage, op="decode")


def _until_more(cluster, stage: str, than: float) -> float:
    deadline = time.monotonic() + 60  # Ray exports metrics with a lag
    while (now := _decodes(cluster, stage)) <= than and time.monotonic() < deadline:
        time.sleep(2)
    return now


def test_realtime_turns_decode_on_the_realtime_pool_and_chat_on_decode(cluster, client):
    """The GPU profile's realtime decode pool (docs/realtime-pool.md): a realtime session holds a seat
    on a RealtimeDecode replica while it is open and its turn decodes there; a chat request decodes
    on Decode; the seat is given back when the session closes; the pool's metrics are exported."""
    import asyncio

    from services.common.redis_config import async_client
    from services.router.session_seats import SessionSeats

    spec = load_profile(MODEL).stages["realtime_decode"].sessions
    seats = SessionSeats(async_client(cluster.redis_url), "realtime_decode", spec.cap, spec.seat_ttl_s)
    loop = asyncio.new_event_loop()  # the client's connections belong to one loop
    held = lambda: sum(loop.run_until_complete(seats.occupancy()).values())  # noqa: E731
    pool, chat, before = _decodes(cluster, "realtime_decode"), _decodes(cluster, "decode"), held()
    with client.realtime.connect(model=MODEL) as conn:
        for event in conn:
            assert event.type != "error", event
            if event.type == "session.created":
                break
        assert held() == before + 1
        conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        )
        conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": 4})
        for event in conn:
            assert event.type != "error", event
            if event.type == "response.done":
                break
    pool = _until_more(cluster, "realtime_decode", pool)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    _until_more(cluster, "decode", chat)
    assert _decodes(cluster, "realtime_decode") == pool  # the chat request did not decode on the pool
    deadline = time.monotonic() + 10  # the gateway gives the seat back as the socket closes
    while held() > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert held() == before
    loop.close()
    with urllib.request.urlopen(cluster.metrics_url, timeout=10) as resp:
        scrape = resp.read().decode()
    assert not {n for n in REALTIME_POOL_SERIES if n not in scrape}


KILLED_ANSWER_TOKENS = 400  # still being written when the kill lands


def test_a_spoken_answer_survives_its_decode_replica(cluster, ray_driver):
    """Last here (it kills a replica): the thinker's decode replica dies mid-answer (a SIGKILL of its
    process and engine) while the talker speaks what it wrote. Once Serve has replaced it, the answer
    goes on from the tokens already sent: the new decode writes the thinker's token stream on, under
    the response's next epoch (services/dataplane/token_stream.py), and the talker, which reads that
    stream, speaks on: every token asked for, one resume counted, and the same text and speech as
    the same answer uninterrupted (greedy text; the talker's draws seeded, it reads the same
    tokens). The dead engine's shared memory is unlinked by its replacement."""
    speech = {
        "modalities": ["text", "audio"],
        "audio": {"voice": "chelsie", "format": "pcm16"},
        "seed": SPEECH_SEED,
    }
    whole = Outcome()
    rest_stream(cluster.http_url, MODEL, whole, KILLED_ANSWER_TOKENS, speech)
    out = Outcome()
    before = resumes(cluster.metrics_url)
    thread = threading.Thread(
        target=rest_stream, args=(cluster.http_url, MODEL, out, KILLED_ANSWER_TOKENS, speech)
    )
    thread.start()
    deadline = time.monotonic() + 60
    while not out.audio and time.monotonic() < deadline:
        time.sleep(0.1)
    assert out.audio, f"no speech before the kill: {out.detail}"
    spoken = len(out.transcript)  # spoken text comes as the audio's transcript
    killed_at = time.monotonic()
    segments = kill(replica_pid("Decode"))
    thread.join(RECOVER_S)
    assert not thread.is_alive(), "the client hung after the replica died"
    print(f"\n[qwen3-faults] decode killed after {spoken} chars: answer done {time.monotonic() - killed_at:.0f} s "
          f"later, {len(out.audio)} audio deltas, transcript {len(out.transcript)} chars; "
          f"audio {sum(n for _, n in out.audio)} b64 chars, uninterrupted {sum(n for _, n in whole.audio)}, "
          f"transcript {len(whole.transcript)}")  # fmt: skip
    assert out.error_at is None and (out.finish, out.tokens) == ("length", KILLED_ANSWER_TOKENS), out.detail
    assert spoken < len(out.transcript) and out.transcript == whole.transcript
    assert sum(n for _, n in out.audio) == sum(n for _, n in whole.audio), "speech lost or repeated"
    assert [a for a in out.audio if a[0] > killed_at + 10], "no speech after the replacement's tokens"
    assert segments and not [path for path in segments if os.path.exists(path)], (
        "the dead engine's shm is left"
    )
    deadline = time.monotonic() + 60  # Ray exports metrics with a lag
    while resumes(cluster.metrics_url) < before + 1 and time.monotonic() < deadline:
        time.sleep(2)
    assert resumes(cluster.metrics_url) >= before + 1
