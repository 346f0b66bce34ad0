"""Every metric the shipped dashboards read is really emitted: after traffic of every kind the
panels show (text, image and long-prompt chat with audio out over REST and gRPC, a quota rejection
and a queued batch request, a realtime session), each name appears in the running system's
Prometheus scrape (Ray's endpoint: our metrics with a `ray_` prefix, after a few seconds)."""

from __future__ import annotations

import base64
import re
import time
import urllib.request

from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc

from services.pipeline.media import wav_bytes
from services.quota.tenants import Limits
from services.realtime.codecs import PCM_RATE
from services.realtime.server_events import WHOLE
from tests.conftest import data_url, grpc_channel, new_tenant, png_bytes, until
from tests.dashboards import REALTIME_POOL_SERIES, all_series_names
from tests.e2e.test_quota_e2e import _post
from tests.e2e.test_realtime import MANUAL_TURNS, _speech
from tests.e2e.test_tracing import LONG_TEXT


def _chat_traffic(openai_client, model_name) -> None:
    audio_out = {"modalities": ["text", "audio"], "audio": {"voice": "default", "format": "pcm16"}}
    stream = openai_client.chat.completions.create(
        model=model_name,
        max_tokens=16,
        messages=[{"role": "user", "content": "Say hi"}],
        stream=True,
        **audio_out,
    )
    assert sum(1 for _ in stream)
    image = {"type": "image_url", "image_url": {"url": data_url(png_bytes(seed=7))}}
    for content in ([{"type": "text", "text": "What is this?"}, image], LONG_TEXT):
        r = openai_client.chat.completions.create(
            model=model_name, max_tokens=8, messages=[{"role": "user", "content": content}]
        )
        assert r.choices[0].message.content


def _grpc_traffic(omniray, model_name) -> None:
    stub = omni_pb2_grpc.OmniStub(grpc_channel(omniray.grpc_target))
    request = omni_pb2.ChatRequest(
        model=model_name,
        messages=[omni_pb2.Message(role="user", content=[omni_pb2.ContentPart(text="hello")])],
        sampling=common_pb2.SamplingParams(max_tokens=8),
    )
    assert list(stub.Chat(request, timeout=60))


def _quota_traffic(omniray) -> None:
    """Interactive requests until the tenant's budget refuses one (429), then a batch request that
    waits in the queue for budget."""
    # A bucket of 100 tokens refilled at 10 a second: requests of ~50 run it dry within a few
    # however long each takes here under 5 s (a bucket of 1,200 refilled at 20 a second never ran
    # dry when the suite's requests took 1.5 s each)
    key = new_tenant(omniray, per_minute=Limits(text_tokens=600), burst_s=10, max_class="interactive")
    codes = []
    while len(codes) < 40 and 429 not in codes:
        codes.append(_post(omniray, key, max_tokens=40).status_code)
    assert 429 in codes
    batch = _post(omniray, key, max_tokens=60, headers={"x-omniray-slo-class": "batch"})
    assert batch.status_code == 200, batch.text


def _realtime_traffic(openai_client, model_name) -> None:
    """Two spoken turns. The engines read the session board by polling it (services/playback/board.py),
    so a session's first response, short and started right after the connect, can end before they
    see the session; the second turn starts after a whole response, and the scheduler ranks it."""
    with openai_client.realtime.connect(model=model_name) as conn:
        seen: list = []
        until(conn, "session.created", seen)
        conn.session.update(session={**MANUAL_TURNS, "max_output_tokens": 16})
        for _ in range(2):
            conn.input_audio_buffer.append(audio=_speech(0.5))
            conn.input_audio_buffer.commit()
            conn.response.create()
            assert until(conn, "response.done", seen).response.status in WHOLE


def _transcription_traffic(openai_client, model_name) -> None:
    """A second of audio to the transcription endpoint (the gateway counts transcribed seconds)."""
    wav = wav_bytes(base64.b64decode(_speech(1.0)), PCM_RATE)
    openai_client.audio.transcriptions.create(model=model_name, file=("tone.wav", wav))


def test_every_dashboard_metric_is_emitted(omniray, openai_client, model_name):
    _chat_traffic(openai_client, model_name)
    _transcription_traffic(openai_client, model_name)
    _grpc_traffic(omniray, model_name)
    _quota_traffic(omniray)
    _realtime_traffic(openai_client, model_name)
    wanted = all_series_names() - REALTIME_POOL_SERIES
    assert len(wanted) > 30
    missing = wanted
    deadline = time.monotonic() + 60
    while missing and time.monotonic() < deadline:
        with urllib.request.urlopen(omniray.metrics_url, timeout=10) as resp:
            scrape = resp.read().decode()
        missing = {n for n in wanted if not re.search(rf"^{n}[{{ ]", scrape, re.M)}
        if missing:
            time.sleep(2)
    assert not missing, " ".join(sorted(missing))
