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
        assert not a.fresh(a.at + 3, stale_s=2) and a.fresh(a.at + 1, stale_s=2)
        monitor.close("t/b")
        await asyncio.to_thread(_wait, lambda: "t/b" not in reader.views())
    finally:
        task.cancel()
        await client.aclose()


@pytest.mark.asyncio
async def test_readers_poll_slowly_while_no_session_is_on_the_board(redis_url):
    """Plain chat traffic leaves the board empty: readers back off to their idle interval, and come
    back to the fast one as soon as a session appears."""
    client = aioredis.Redis.from_url(redis_url)
    await client.delete("omniray:sessions")
    reader = BoardReader(redis_url, interval_s=0.01, idle_interval_s=0.4)
    polls = []
    real = reader.client.hgetall
    reader.client.hgetall = lambda key: polls.append(time.monotonic()) or real(key)
    monitor = PlaybackMonitor()
    writer = BoardWriter(monitor, client, interval_s=0.01)
    try:
        await asyncio.sleep(1.0)
        assert len(polls) <= 4  # 1 s at 0.4 s, not 100 at 10 ms
        monitor.open("t/idle")
        await writer.publish()
        await asyncio.to_thread(_wait, lambda: "t/idle" in reader.views())
        before = len(polls)
        await asyncio.sleep(0.5)
        assert len(polls) - before >= 15  # back at the fast interval
    finally:
        await client.delete("omniray:sessions")
        await client.aclose()
