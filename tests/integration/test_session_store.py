"""The realtime session store on a real Redis (services/realtime/continuity.py): a saved session
loads back exactly (clips bit for bit: the same audio makes the same prompt), only new clips are
written and gone ones dropped, a resume takes the session over (the old connection's saves are
refused), records expire after the grace period."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.common.redis_config import async_client
from services.common.session_key import SessionKey
from services.realtime.continuity import SavedItem, SavedState, SessionStore, Taken

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
        owner = await store.claim(KEY, fresh=True)
        a = _pcm_samples(2400, 0)
        user = SavedItem(id="item_1", role="user", text="q", clips=["clip:item_1:0"])
        await store.save(KEY, owner, _state(user), {"clip:item_1:0": a}, [])
        state, clips = await store.load(KEY)
        assert state == _state(user) and np.array_equal(clips["clip:item_1:0"], a)  # bit for bit

        # the turn leaves the window: its clip goes; a new one comes
        b = _pcm_samples(1200, 1)
        later = SavedItem(id="item_2", role="user", clips=["clip:item_2:0"])
        await store.save(KEY, owner, _state(later), {"clip:item_2:0": b}, ["clip:item_1:0"])
        fields = await redis.hkeys(store.key(KEY))
        assert sorted(fields) == [b"clip:item_2:0", b"owner", b"state"]

        # a reconnect takes it over: the old connection can no longer write
        new_owner = await store.claim(KEY, fresh=False)
        with pytest.raises(Taken):
            await store.save(KEY, owner, _state(), {}, [])
        await store.save(KEY, new_owner, _state(later), {}, [])
        assert (await store.load(KEY))[0] == _state(later)

        await asyncio.sleep(3)  # past the grace period
        assert await store.load(KEY) is None
    finally:
        await redis.aclose()
