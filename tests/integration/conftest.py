"""Fixtures of the store's integration tests, and a Redis server of a test's own to stall and kill."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from kv_store.metadata import KvMetadata


@pytest.fixture
async def meta(redis_url):
    """The store's Redis metadata under a key prefix of its own (tests share one server)."""
    client = aioredis.Redis.from_url(redis_url)
    yield KvMetadata(client, prefix=f"t{uuid.uuid4().hex}")
    await client.aclose()


@dataclass
class RedisServer:
    """A real Redis (valkey) process on a fixed port: stalled with SIGSTOP (the kernel still accepts
    connections, nothing answers), killed, and restarted empty on the same port."""

    port: int
    run_dir: Path
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def restart(self) -> None:
        from services import runtime

        self.proc = runtime.start_redis(self.port, self.run_dir)


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    from services import runtime

    port = runtime.free_port()
    server = RedisServer(port, tmp_path, runtime.start_redis(port, tmp_path))
    yield server
    server.proc.send_signal(signal.SIGCONT)  # a stopped process would not act on SIGTERM
    server.proc.terminate()
    server.proc.wait(10)
