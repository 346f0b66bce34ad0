"""`make bench-encoder`: head-of-line blocking in the encoder pool, FIFO vs the tile scheduler.

One encoder replica (the real Encoder stage class and the profile's real vision model, run in
process), one run: a document of `--doc-tiles` tiles arrives, and single-image chat requests arrive
every `--chat-interval-ms` while it is encoded. Reported per policy: chat p50/p99 latency and the
document's completion time; then the ratios (the tile scheduler must cut chat p99 >= 5x and keep the
document within +20%). Also shows the feature cache: the same image again does no encoder work.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import platform
import statistics
import time

import numpy as np
from omni.v1 import common_pb2, stages_pb2

from loadtest import results
from services.dataplane import tensors
from services.models.profile import load_profile
from services.router.tiles import TILE_POLICY_VERSION, tile_grid
from services.stages.tile_scheduler import TileScheduler


def _image(seed: int, size: tuple[int, int]) -> np.ndarray:
    """Decoded pixels, as the gateway hands them to the encoder."""
    return np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)


def _item(pixels: np.ndarray, size: tuple[int, int], profile) -> stages_pb2.MediaItem:
    g = tile_grid(*size, "high", profile.tiling.tile_px, profile.tiling.max_tiles)
    return stages_pb2.MediaItem(
        modality="image",
        data=tensors.describe(pixels, content_hash=hashlib.sha256(pixels.tobytes()).hexdigest()),
        detail="high",
        tiles=stages_pb2.TileGrid(
            cols=g.cols, rows=g.rows, tile_px=g.tile_px, policy_version=TILE_POLICY_VERSION
        ),
    )


POLICIES = ("fifo", "fewest_pending")  # the tile scheduler's, FIFO first


def p99(ordered: list[float]) -> float:
    """The 99th percentile of sorted values (nearest rank)."""
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


async def timed_encode(encoder, rid: str, items: list) -> float:
    """Seconds one Encode call on an in-process encoder replica takes."""
    t0 = time.perf_counter()
    req = stages_pb2.EncodeRequest(ctx=common_pb2.RequestContext(request_id=rid, tenant="bench"), items=items)
    await encoder.Encode(req)
    return time.perf_counter() - t0


async def _run_policy(encoder, policy: str, doc: list, chats: list, interval_s: float) -> dict:
    pool = encoder.profile.encoder_pool
    encoder.scheduler = TileScheduler(pool.batch_size, policy, pool.aging_tiles_per_s)
    encoder.cache.clear()  # every request does encoder work

    doc_task = asyncio.create_task(timed_encode(encoder, f"{policy}-doc", doc))
    chat_tasks = []
    for i, item in enumerate(chats):
        await asyncio.sleep(interval_s)
        chat_tasks.append(asyncio.create_task(timed_encode(encoder, f"{policy}-chat{i}", [item])))
    doc_s = await doc_task
    chat_s = sorted(await asyncio.gather(*chat_tasks))
    return {
        "doc_s": doc_s,
        "chat_p50_s": statistics.median(chat_s),
        "chat_p99_s": p99(chat_s),
        "n_chat": len(chat_s),
    }


async def main_async(args) -> dict:
    from services.stages.encoder import Encoder

    profile = load_profile(args.profile)
    encoder = Encoder.func_or_class(profile.model_dump())
    tile = profile.tiling.tile_px
    per_image = min(profile.tiling.max_tiles, 40)
    cols = max(1, int(math.sqrt(per_image)))
    rows = per_image // cols
    page_size = (cols * tile, rows * tile) if per_image > 1 else (tile, tile)
    pages = math.ceil(args.doc_tiles / (cols * rows if per_image > 1 else 1))
    doc = [_item(_image(p, page_size), page_size, profile) for p in range(pages)]
    doc_tiles = sum(i.tiles.cols * i.tiles.rows for i in doc)
    chats = [_item(_image(1000 + i, (tile, tile)), (tile, tile), profile) for i in range(args.chats)]
    # Warm-up (first batches are slower).
    await _run_policy(encoder, "fifo", doc[:1], chats[:2], 0.0)
    out = {
        "profile": args.profile,
        "doc_tiles": doc_tiles,
        "batch_size": profile.encoder_pool.batch_size,
        "chat_interval_ms": args.chat_interval_ms,
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
    }
    for policy in POLICIES:
        out[policy] = await _run_policy(encoder, policy, doc, chats, args.chat_interval_ms / 1000)
        r = out[policy]
        print(
            f"  {policy:15s} chat p50 {r['chat_p50_s'] * 1000:7.1f} ms  p99 {r['chat_p99_s'] * 1000:7.1f} ms"
            f"  document {r['doc_s'] * 1000:7.0f} ms",
            flush=True,
        )
    f, t = out["fifo"], out["fewest_pending"]
    out["chat_p99_cut"] = f["chat_p99_s"] / t["chat_p99_s"]
    out["doc_time_ratio"] = t["doc_s"] / f["doc_s"]
    print(
        f"[encoder-hol] chat p99 FIFO / tile scheduler = {out['chat_p99_cut']:.1f}x (target >= 5x); "
        f"document time tile scheduler / FIFO = {out['doc_time_ratio']:.2f} (target <= 1.20)"
    )
    # Feature cache: the same image twice; the second does no encoder work.
    item = chats[0]
    before = encoder.scheduler.pending
    t0 = time.perf_counter()
    await encoder.Encode(
        stages_pb2.EncodeRequest(ctx=common_pb2.RequestContext(request_id="c1", tenant="b"), items=[item])
    )
    miss = time.perf_counter() - t0
    t0 = time.perf_counter()
    await encoder.Encode(
        stages_pb2.EncodeRequest(ctx=common_pb2.RequestContext(request_id="c2", tenant="b"), items=[item])
    )
    hit = time.perf_counter() - t0
    assert encoder.scheduler.pending == before
    out["cache"] = {"miss_ms": miss * 1000, "hit_ms": hit * 1000}
    print(f"[encoder-hol] feature cache: first {miss * 1000:.1f} ms, same image again {hit * 1000:.2f} ms")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="small")
    ap.add_argument("--doc-tiles", type=int, default=200)
    ap.add_argument("--chats", type=int, default=40)
    ap.add_argument("--chat-interval-ms", type=float, default=20.0)
    args = ap.parse_args(argv)
    out = asyncio.run(main_async(args))
    print(f"[encoder-hol] wrote {results.write('encoder-hol', args.profile, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
