"""`make bench-preload`: on-path KV reload time of a turn that follows a speech start, with and
without speech-triggered preload, in the same run.

A session's history (default 2048 tokens of SmolLM2-135M KV, fp32, 32-token pages) has been pushed
out of the engine's L2 pool to the L3 disk tier by other sessions. The user starts speaking: the
session board says so, the store's `PlaybackFollower` steps (preload on or off); the user speaks for
`--speech-s`; then the turn reaches prefill and the store fetches the chain (the on-path reload,
timed). Real Redis, real NIXL-registered pool, real disk tier. Target: >= 80% lower with preload.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from kv_store.disk import DiskTier
from kv_store.eviction import PageInfo, create
from kv_store.follower import FollowerParams, PlaybackFollower
from kv_store.layout import PageLayout
from kv_store.metadata import KvMetadata
from kv_store.store import KvStore
from kv_store.transfer import PagePool
from loadtest import results
from services import runtime
from services.playback.board import BoardView

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; vLLM CPU blocks of 32 tokens; float32.
LAYOUT = PageLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_tokens=32, dtype="float32")


def _view(speaking: bool) -> BoardView:
    return BoardView(session_id="s", played_ms=0.0, age_s=0.0, ms_per_token=None, buffered_ms=0, playing=False, speaking=speaking, responding=False, first_audio=True,
                     barge_ins=0, responses=1, reply_gap_ms=800, at=time.time())  # fmt: skip


async def one_turn(meta: KvMetadata, tmp: Path, history_tokens: int, speech_s: float, preload: bool) -> float:
    chain_len = history_tokens // LAYOUT.page_tokens
    pool = PagePool(f"bench-pre-{uuid.uuid4().hex[:6]}", LAYOUT, chain_len)
    disk = DiskTier(
        f"bench-pre-l3-{uuid.uuid4().hex[:6]}", pool, tmp / f"{uuid.uuid4().hex}.pages", 3 * chain_len
    )
    store = KvStore(f"bench-{uuid.uuid4().hex[:6]}", pool, meta, create("lru"), disk)
    try:
        rng = np.random.default_rng(0)
        session = f"bench/{uuid.uuid4().hex}"
        chain = [f"{session}/{i}" for i in range(chain_len)]
        for i, page in enumerate(chain):
            await store.put(
                page, rng.integers(0, 255, LAYOUT.page_bytes, dtype=np.uint8), PageInfo(position=i)
            )
        await meta.append_chain(session, chain)
        for i in range(chain_len):  # other sessions push it out to L3
            await store.put(f"{session}/other{i}", rng.integers(0, 255, LAYOUT.page_bytes, dtype=np.uint8))
        follower = PlaybackFollower(store, FollowerParams(preload=preload, deadline_s=max(speech_s, 0.5)))
        follower.saw(session, chain)
        await follower.step({session: _view(False)})
        await follower.step({session: _view(True)})  # speech starts
        await asyncio.sleep(speech_s)  # the user talks; the turn ends; VAD's silence passes
        started = time.perf_counter()
        fetched = await store.fetch(chain)  # the turn reaches prefill: the on-path reload
        on_path = time.perf_counter() - started
        assert all(v is not None for v in fetched.values())
        store.release(chain)
        return on_path
    finally:
        disk.close()


async def main_async(args) -> dict:
    port = runtime.free_port()
    with tempfile.TemporaryDirectory(prefix="omniray-preload-") as tmp:
        proc = runtime.start_redis(port, Path(tmp))
        client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
        try:
            meta = KvMetadata(client, prefix="bench")
            runs = {"preload": [], "no_preload": []}
            for _ in range(args.repeats):  # interleaved: both see the same machine state
                for name, preload in (("no_preload", False), ("preload", True)):
                    runs[name].append(await one_turn(meta, Path(tmp), args.history, args.speech_s, preload))
        finally:
            await client.aclose()
            proc.terminate()
    med = {k: statistics.median(v) * 1000 for k, v in runs.items()}
    return {"history_tokens": args.history, "speech_s": args.speech_s, "repeats": args.repeats,
            "median_ms": med, "runs_ms": {k: [x * 1000 for x in v] for k, v in runs.items()},
            "reduction": 1 - med["preload"] / med["no_preload"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=2048)
    ap.add_argument("--speech-s", type=float, default=0.8)
    ap.add_argument("--repeats", type=int, default=5)
    out = asyncio.run(main_async(ap.parse_args()))
    m = out["median_ms"]
    print(
        f"on-path reload of {out['history_tokens']} tokens after speech start (median of {out['repeats']}):"
    )
    print(f"  without preload {m['no_preload']:.1f} ms, with preload {m['preload']:.1f} ms "
          f"-> {out['reduction']:.0%} lower (target >= 80%)")  # fmt: skip
    print(f"  saved {results.write('preload', None, out)}")


if __name__ == "__main__":
    main()
