"""Shared fixtures and helpers. The shared `tiny` deployment (`omniray`) is tests/e2e's: started once
for that package, its fault tests last, and stopped when it is done (tests/e2e/conftest.py)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis.asyncio as aioredis
import soundfile
from PIL import Image

from services.quota import LOCAL_API_KEY
from services.quota.tenants import TenantSpec, put_tenant
from tests.unit.kernels.interpreter import import_triton_for_interpreter

import_triton_for_interpreter()  # before anything else imports triton (vLLM does)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
AUTH = {"Authorization": f"Bearer {LOCAL_API_KEY}"}

# Short autoscaling delays so a test can watch a stage scale up and back down. Scaling down waits
# longer: on CI's two busy cores a new replica takes ~10 s to start (a fresh worker importing torch),
# and with a 3 s delay the controller cancelled it whenever the encoder saw a lull meanwhile.
ENCODER_AUTOSCALING = {
    "autoscaling_config": {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 1,
        "upscale_delay_s": 0.5,
        "downscale_delay_s": 20,
        "look_back_period_s": 1,
        "metrics_interval_s": 0.5,
    }
}


# How services/common/errors.py logs an internal error: the id a client's 500 quotes.
SERVER_ERROR = re.compile(r"\[err_[0-9a-f]{16}\]")


def server_errors(ray_temp_dir: str, limit: int = 3, lines_after: int = 40) -> str:
    """A local run's last logged internal errors, each with the lines after it (its traceback):
    what a failed test's 500 quotes, read before the run's logs are removed."""
    found = []
    for f in sorted(Path(ray_temp_dir, "session_latest", "logs").rglob("*")):
        if f.suffix not in (".log", ".err", ".out"):
            continue
        try:
            lines = f.read_text(errors="replace").splitlines()
        except OSError:  # a directory, or rotated away meanwhile
            continue
        found += [f"{f.name}:\n" + "\n".join(lines[i : i + lines_after]) for i, line in enumerate(lines)
                  if SERVER_ERROR.search(line)]  # fmt: skip
    return "\n\n".join(found[-limit:])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a local run gets the run's logged internal errors in its report (a
    run shared by a package's tests has its earlier tests' too)."""
    report = yield
    if report.failed and call.when == "call":
        from services.runtime import LocalCluster

        for value in item.funcargs.values():
            if (
                isinstance(value, LocalCluster)
                and value.ray_temp_dir
                and (errors := server_errors(value.ray_temp_dir))
            ):
                report.sections.append(("omniray internal errors", errors))
    return report


@contextlib.contextmanager
def local_cluster(profile: str, **kwargs):
    from services import runtime

    with runtime.temporary(profile, prefix="omniray-test-", timeout_s=420, **kwargs) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def otlp_receiver():
    """Where the session's deployment exports its trace spans (OTLP/gRPC, kept in memory)."""
    from tests.otlp_receiver import OtlpReceiver

    with OtlpReceiver.running() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def model_name() -> str:
    return "omniray-tiny"


def png_bytes(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def wav_bytes(seconds: float = 1.0, rate: int = 16000, freq: float = 220.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(
        buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16"
    )
    return buf.getvalue()


def data_url(png: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(png).decode()}"


@dataclass
class StreamedAudio:
    pcm: bytes
    transcript: str
    rates: set[int]
    chunk_times: list[float]  # monotonic arrival time of each audio chunk
    end_time: float  # when the stream closed


def collect_audio(stream) -> StreamedAudio:
    """Audio deltas of an OpenAI SDK chat stream (`delta.audio`: data, transcript, sample_rate)."""
    pcm, transcript, rates, times = bytearray(), [], set(), []
    for chunk in stream:
        if not chunk.choices:
            continue
        audio = getattr(chunk.choices[0].delta, "audio", None)
        if audio:
            audio = audio.model_dump()  # typed in the SDK; sample_rate is our extra field
            if audio.get("data"):
                pcm += base64.b64decode(audio["data"])
                rates.add(audio["sample_rate"])
                times.append(time.monotonic())
            if audio.get("transcript"):
                transcript.append(audio["transcript"])
    return StreamedAudio(bytes(pcm), "".join(transcript), rates, times, time.monotonic())


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real Redis-compatible server (valkey) for this test session."""
    from services import runtime

    port = runtime.free_port()
    proc = runtime.start_redis(port, tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


class _BearerAuth(
    grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamStreamClientInterceptor
):
    def __init__(self, key: str):
        self.key = key

    def _with_key(self, details):
        metadata = [*(details.metadata or []), ("authorization", f"Bearer {self.key}")]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_key(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_key(details), request)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_key(details), request_iterator)


def new_tenant(omniray, **kw) -> str:
    """Register a fresh tenant in the cluster's Redis; returns its API key."""
    key = f"sk-test-{uuid.uuid4().hex}"

    async def put():
        client = aioredis.Redis.from_url(omniray.redis_url)
        try:
            spec = TenantSpec(id=f"t-{uuid.uuid4().hex[:8]}", **{"burst_s": 60, **kw})
            await put_tenant(client, spec, [key])
        finally:
            await client.aclose()

    asyncio.run(put())
    return key


def owner_process(target, args: tuple, redis_url: str, ready_key: str, timeout_s: float = 60):
    """Start `target(*args)` in a spawned process (a pool owner: an engine's, an encoder replica's)
    and wait until it sets `ready_key` in Redis; returns (process, client)."""
    import multiprocessing

    import redis

    proc = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    proc.start()
    r = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout_s
    while not r.exists(ready_key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.exists(ready_key), "owner process did not start"
    return proc, r


def until(conn, kind: str, seen: list):
    """The next event of `kind` on a realtime connection (the SDK's, or a gRPC event stream); every
    event read goes into `seen`."""
    for event in conn:
        seen.append(event)
        if event.type == kind:
            return event
    raise AssertionError(f"connection closed before {kind}: {[e.type for e in seen]}")


def grpc_channel(target: str, key: str | None = LOCAL_API_KEY) -> grpc.Channel:
    """An insecure channel whose calls carry `authorization: Bearer <key>` (none if key is None)."""
    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=30)
    return channel if key is None else grpc.intercept_channel(channel, _BearerAuth(key))


def load_adapter(profile_name: str, role: str):
    """A prepared model of a profile, loaded the way its stage loads it (skips when not built)."""
    from services.models.profile import load_profile
    from services.models.registry import adapter_module

    profile = load_profile(profile_name)
    spec = getattr(profile.models, role)
    path = profile.model_path(spec)
    if not path.exists():
        pytest.skip(f"run `make models PROFILE={profile_name}` first")
    return adapter_module(spec.adapter).load(path, spec.options)


FAULTS = "faults"  # a package's tests that kill, drain or redeploy parts of its deployment


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """A package's `faults/` tests run after the package's others, so those meet a deployment no
    fault test has changed; they stay inside the package, which keeps its one deployment."""

    def package(item: pytest.Item) -> Path:
        folder = item.path.parent
        return folder.parent if folder.name == FAULTS else folder

    first: dict[Path, int] = {}
    for index, item in enumerate(items):
        first.setdefault(package(item), index)
    items.sort(key=lambda item: (first[package(item)], item.path.parent.name == FAULTS))


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """`make test` (OMNIRAY_PYTEST_HARD_EXIT=1): once every result is reported and every fixture torn
    down, leave with pytest's own status, skipping the interpreter's teardown — one full run of the
    suite crashed there (SIGSEGV after its summary, with torch, vLLM, Ray and FFmpeg threads in the
    process), which would turn a passing run into a failing one."""
    if os.environ.get("OMNIRAY_PYTEST_HARD_EXIT") == "1" and _EXIT_STATUS in config.stash:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[_EXIT_STATUS])
