"""The peer a user would pick instead: vLLM's own OpenAI server on the profile's thinker, started with
the decode engine's arguments (dtype, context length, batch size, stream interval, block size, KV
space, CPU binding) so that `make bench` compares serving layers, not engine settings."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.models.profile import Profile


def command(profile: Profile, port: int) -> list[str]:
    """The server's command line: paths and engine arguments only (no request text)."""
    e = profile.engine
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(profile.model_path(profile.models.thinker)),
        "--served-model-name",
        profile.served_model_name,
        "--dtype",
        e.dtype,
        "--max-model-len",
        str(e.max_model_len),
        "--max-num-seqs",
        str(e.max_num_seqs),
        "--stream-interval",
        str(e.stream_interval),
        "--block-size",
        str(e.block_size),
        "--enable-prompt-embeds",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--uvicorn-log-level",
        "warning",
    ]
    if e.enforce_eager:
        args.append("--enforce-eager")
    return args


def environment(profile: Profile) -> dict[str, str]:
    e = profile.engine
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(e.kv_cache_space_gib),
        "VLLM_CPU_OMP_THREADS_BIND": e.cpu_threads_bind.get("decode", "auto"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_HOST_IP": "127.0.0.1",
    }


@dataclass(frozen=True)
class Server:
    pid: int
    url: str  # http://127.0.0.1:<port>


@contextlib.contextmanager
def running(profile: Profile, port: int, log: Path, timeout_s: float = 600.0) -> Iterator[Server]:
    """vLLM's server on 127.0.0.1:`port` until the block ends."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command(profile, port),
            env=environment(profile),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its engine processes go with it
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vLLM's server not up after {timeout_s:.0f} s; see {log}") from None
                time.sleep(1)
        yield Server(proc.pid, f"http://127.0.0.1:{port}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
