"""The gateway's load meter (services/gateway/load_meter.py) on a real Redis: what a replica admits
adds up by kind in `omniray:load`, realtime sessions as session-seconds; with Redis away the counts
wait for the next flush, and nothing raises."""

from __future__ import annotations

import asyncio

from services.common.redis_config import async_client, sync_client
from services.extensions.ray.sla_autoscaling import KEY
from services.gateway.load_meter import LoadMeter
from services.quota.service import Cost


async def test_admitted_load_adds_up_by_kind(redis_url):
    sync_client(redis_url).delete(KEY)
    meter = LoadMeter(async_client(redis_url), interval_s=3600)
    meter.sessions = lambda: 4
    meter.add(Cost(text_tokens=300, image_tiles=4))
    meter.add(Cost(text_tokens=100, audio_seconds=2.5))
    await asyncio.sleep(0.2)
    await meter.flush()
    totals = {k.decode(): float(v) for k, v in sync_client(redis_url).hgetall(KEY).items()}
    assert {k: totals[k] for k in ("requests", "text_tokens", "image_tiles", "audio_seconds")} == {
        "requests": 2.0, "text_tokens": 400.0, "image_tiles": 4.0, "audio_seconds": 2.5}  # fmt: skip
    assert 0.8 <= totals["session_seconds"] <= 2.0  # 4 sessions for the ~0.2 s since the meter began
    meter._task.cancel()


async def test_counts_wait_out_an_unreachable_redis(redis_url):
    sync_client(redis_url).delete(KEY)
    meter = LoadMeter(async_client("redis://127.0.0.1:1/0"), interval_s=3600)
    meter.add(Cost(image_tiles=7))
    await meter.flush()  # Redis away: kept, no exception
    meter.redis = async_client(redis_url)
    await meter.flush()
    assert float(sync_client(redis_url).hget(KEY, "image_tiles")) == 7.0
    meter._task.cancel()
