"""The realtime session store on a real Redis (services/realtime/continuity.py): a saved session
loads back exactly (clips bit for bit: the same audio makes the same prompt), only new clips are
written and gone ones dropped, a resume takes the session over (the old connection's saves are
refused), records expire after the grace period (a live connection is told and saves it anew)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.common.redis_config import async_client
from services.common.session_key import SessionKey
from services.realtime.continuity import Lapsed, SavedItem, SavedState, SessionStore, Taken

KEY = SessionKey("t1", "sess_abc")


def _state(*items: SavedItem) -> SavedState:
    return SavedState(
        config={"instructions": "hi"}, conversation_id="conv_1", items=list(items), head_tokens=7
    )


def _pcm_samples(n: int, seed: int) -> np.ndarray:
    pcm = np.random.default_rng(seed).integers(-32768, 32767, n, dtype=np.int16)
    return pcm.astype(np.float32) / 32768.0  # as AudioClip.from_pcm16 makes them


@pytest.mark.asyncio
async def test_save_load_takeover_and_expiry(redis_url):
    redis = async_client(redis_url)
    store = SessionStore(redis, grace_s=2)
    try:
        assert await store.resume(KEY) is None  # nothing saved yet
        owner = await store.claim(KEY)
        a = _pcm_samples(2400, 0)
        user = SavedItem(id="item_1", role="user", text="q", clips=["clip:item_1:0"])
        await store.save(KEY, owner, _state(user), {"clip:item_1:0": a}, [])
        new_owner, state, clips = await store.resume(KEY)  # a reconnect takes it over
        assert state == _state(user) and np.array_equal(clips["clip:item_1:0"], a)  # bit for bit
        with pytest.raises(Taken):  # the old connection can no longer write
            await store.save(KEY, owner, _state(), {}, [])
        owner = new_owner

        # the turn leaves the window: its clip goes; a new one comes
        b = _pcm_samples(1200, 1)
        later = SavedItem(id="item_2", role="user", clips=["clip:item_2:0"])
        await store.save(KEY, owner, _state(later), {"clip:item_2:0": b}, ["clip:item_1:0"])
        fields = await redis.hkeys(store.key(KEY))
        assert sorted(fields) == [b"clip:item_2:0", b"owner", b"state"]

        await asyncio.sleep(3)  # past the grace period with no save
        assert await store.resume(KEY) is None
        with pytest.raises(Lapsed):  # the live connection is told, claims it again, saves it all
            await store.save(KEY, owner, _state(later), {}, [])
        await store.claim(KEY, owner)
        await store.save(KEY, owner, _state(later), {"clip:item_2:0": b}, [])
        assert (await store.resume(KEY))[1] == _state(later)
    finally:
        await redis.aclose()
