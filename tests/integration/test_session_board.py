"""The session board through a real Redis: the gateway's monitor views reach a reader in another
process's shoes (a poll thread), closed sessions leave, and a reader extrapolates playback."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from services.playback.board import BoardReader, BoardWriter
from services.playback.monitor import PlaybackMonitor


def _wait(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "board did not catch up"
        time.sleep(0.01)


@pytest.mark.asyncio
async def test_views_reach_the_reader_and_closed_sessions_leave(redis_url):
    monitor = PlaybackMonitor()
    client = aioredis.Redis.from_url(redis_url)
    writer = BoardWriter(monitor, client, interval_s=0.01)
    reader = BoardReader(redis_url, interval_s=0.01)
    monitor.open("t/a")
    monitor.open("t/b")
    monitor.response_started("t/a")
    monitor.audio_sent("t/a", 4000)
    monitor.speech_started("t/b")
    task = asyncio.create_task(writer.run())
    try:
        await asyncio.to_thread(_wait, lambda: {"t/a", "t/b"} <= reader.views().keys())
        a, b = reader.views()["t/a"], reader.views()["t/b"]
        assert a.playing and a.first_audio and a.responses == 1 and 3000 < a.buffered_ms <= 4000
        assert b.speaking and not b.playing
        later = a.at + 1.5
        assert a.buffered_at(later) == pytest.approx(max(0.0, a.buffered_ms - 1500))
        # the same view, published on: the reader keeps the object (its course did not change)
        await asyncio.sleep(0.1)
        assert reader.views()["t/a"] is a and reader.views().epoch > 1
        monitor.close("t/b")
        await asyncio.to_thread(_wait, lambda: "t/b" not in reader.views())
    finally:
        task.cancel()
        await client.aclose()
