"""Live session signals in the store (real Redis, real NIXL pool, L3 on disk): the next-use policy
keeps a speaking session's pages and evicts an idle one's first; speech start preloads a session's
offloaded pages into L2 when they fit before the deadline, and refuses when they do not."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from kv_store.disk import DiskTier
from kv_store.eviction import PageInfo, create
from kv_store.follower import FollowerParams, PlaybackFollower
from kv_store.layout import PageLayout
from kv_store.store import KvStore
from kv_store.transfer import PagePool
from services.playback.board import BoardView

LAYOUT = PageLayout(num_layers=1, num_kv_heads=1, head_dim=32, page_tokens=16, dtype="float16")
NOW = 1_000_000.0


def _bytes(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 255, LAYOUT.page_bytes, dtype=np.uint8)


def view(speaking=False, buffered_ms=0.0, barge_ins=0, age_s=0.0) -> BoardView:
    return BoardView(session_id="s", played_ms=0.0, age_s=age_s, ms_per_token=None, buffered_ms=buffered_ms, playing=buffered_ms > 0, speaking=speaking,
                     responding=buffered_ms > 0, first_audio=True, barge_ins=barge_ins, responses=1,
                     reply_gap_ms=800.0, at=NOW)  # fmt: skip


async def test_next_use_keeps_speaking_and_playing_sessions_and_evicts_idle_ones(meta):
    pool = PagePool(f"sess-nu-{uuid.uuid4().hex[:6]}", LAYOUT, 6)
    follower: PlaybackFollower | None = None
    store = KvStore("node-n", pool, meta, create("next_use", predict=lambda p: follower.predict(p)))
    follower = PlaybackFollower(store, FollowerParams(idle_s=30), clock=lambda: NOW)
    pages = {s: [f"{s}{i}" for i in range(2)] for s in ("talk", "play", "idle")}
    for s, ps in pages.items():
        for i, p in enumerate(ps):
            await store.put(p, _bytes(hash(p) % 1000), PageInfo(position=i))
        follower.saw(s, ps)
    await follower.step({"talk": view(speaking=True), "play": view(buffered_ms=3000), "idle": view(age_s=45)})
    assert follower.predict("talk0") == NOW
    assert follower.predict("play1") == pytest.approx(NOW + 3.0 + 0.8)
    assert follower.predict("idle0") == NOW + 30
    follower.saw("talk", ["new0", "new1", "new2"])  # the speaking session's next turn
    await store.put("new0", _bytes(7))
    await store.put("new1", _bytes(8))
    # The idle session's pages go first, its suffix page before its prefix page.
    assert pool.get("idle1") is None and pool.get("idle0") is None
    assert all(pool.get(p) is not None for p in pages["talk"] + pages["play"])
    await follower.step({"talk": view(speaking=True)})  # play left the board: not expected again
    assert follower.predict("play0") == float("inf")
    await store.put("new2", _bytes(9))
    assert pool.get("play1") is None and all(pool.get(p) is not None for p in pages["talk"])


async def test_a_session_between_turns_is_next_after_the_speaking_ones(meta):
    """Its reply was heard a moment ago: the user answers within seconds — sooner than a session
    with seconds of reply still to play, and far sooner than one quiet for long."""
    pool = PagePool(f"sess-gap-{uuid.uuid4().hex[:6]}", LAYOUT, 6)
    store = KvStore("node-g", pool, meta, create("lru"))
    follower = PlaybackFollower(store, FollowerParams(idle_s=30, default_gap_s=1.0), clock=lambda: NOW)
    for s in ("heard", "play", "quiet"):
        follower.saw(s, [f"{s}0"])
    await follower.step({"heard": view(age_s=0.5), "play": view(buffered_ms=3000), "quiet": view(age_s=20)})
    assert follower.predict("heard0") == pytest.approx(NOW + 1.5)
    assert follower.predict("heard0") < follower.predict("play0") < follower.predict("quiet0") == NOW + 21


async def _offloaded(meta, tmp_path, chain_len=4):
    """A store whose session `s` has all its pages in L3 (pushed out of L2 by other pages)."""
    pool = PagePool(f"sess-pre-{uuid.uuid4().hex[:6]}", LAYOUT, 4)
    disk = DiskTier(f"sess-pre-l3-{uuid.uuid4().hex[:6]}", pool, tmp_path / "l3", 32)
    store = KvStore("node-p", pool, meta, create("lru"), disk)
    chain = [f"s{i}" for i in range(chain_len)]
    for i, p in enumerate(chain):
        await store.put(p, _bytes(i), PageInfo(position=i))
    await meta.append_chain("s", chain)
    for i in range(4):
        await store.put(f"other{i}", _bytes(100 + i))
    assert not any(store.here(p) for p in chain)
    return store, disk, chain


async def test_speech_start_preloads_the_sessions_offloaded_pages(meta, tmp_path):
    store, disk, chain = await _offloaded(meta, tmp_path, chain_len=3)
    try:
        follower = PlaybackFollower(store, FollowerParams(), clock=lambda: NOW)
        follower.saw("s", chain)
        await follower.step({"s": view()})
        assert not follower.preloads  # not speaking: nothing to do
        await follower.step({"s": view(speaking=True)})
        outcomes = await follower.preloads["s"].wait()
        assert set(outcomes.values()) == {"done"} and all(store.here(p) for p in chain)
        for i, p in enumerate(chain):
            assert np.array_equal(await store.get(p), _bytes(i))
    finally:
        disk.close()


async def test_a_preload_that_cannot_arrive_in_time_is_refused(meta, tmp_path):
    store, disk, chain = await _offloaded(meta, tmp_path)
    try:
        follower = PlaybackFollower(
            store, FollowerParams(bandwidth_bps=1.0, deadline_s=0.5), clock=lambda: NOW
        )
        follower.saw("s", chain)
        await follower.step({"s": view(speaking=True)})
        assert not follower.preloads and not any(store.here(p) for p in chain)
        follower.p.max_pages = 2
        follower.p.bandwidth_bps = 1e12
        await follower.step({"s": view(speaking=True, barge_ins=1)})  # a barge-in: try again
        assert not follower.preloads  # 4 pages over the bound of 2 in flight
        follower.p.max_pages = 64
        await follower.step({"s": view(speaking=True, barge_ins=2)})
        assert set((await follower.preloads["s"].wait()).values()) == {"done"}
    finally:
        disk.close()
