"""`make bench-kv-transfer`: pulling 64 MiB of KV pages from another process over NIXL (UCX) vs a
plain in-process copy of the same bytes. Same run, medians of `--repeats`; target >= 40% of the copy
bandwidth."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time

import numpy as np

from kv_store.layout import PageLayout
from kv_store.transfer import PagePool, PoolAddress
from loadtest import results

# 256 KiB pages: 16 tokens x 32 layers x K/V x 8 heads x 128 dims x fp16 would be 2 MiB; this is a
# smaller model's page (4 layers), so 64 MiB is 256 pages.
LAYOUT = PageLayout(num_layers=4, num_kv_heads=8, head_dim=128, page_tokens=16, dtype="float16")


def _owner(conn, total_bytes: int) -> None:
    pages = total_bytes // LAYOUT.page_bytes
    pool = PagePool("bench-owner", LAYOUT, pages)
    data = np.random.default_rng(0).integers(0, 255, (pages, LAYOUT.page_bytes), dtype=np.uint8)
    for i in range(pages):
        assert pool.put(i, data[i]) == i
    conn.send(pool.address())
    while not conn.poll(0.001):
        pool.progress()


async def _pull_all(reader: PagePool, address: PoolAddress, pages: int) -> float:
    for i in range(pages):
        reader.free(i)
    t0 = time.perf_counter()
    await reader.pull(address, [(i, i) for i in range(pages)])
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    total = args.mib * 1024 * 1024
    pages = total // LAYOUT.page_bytes
    parent, child = multiprocessing.get_context("spawn").Pipe()
    owner = multiprocessing.get_context("spawn").Process(target=_owner, args=(child, total), daemon=True)
    owner.start()
    address = parent.recv()
    reader = PagePool("bench-reader", LAYOUT, pages)
    asyncio.run(_pull_all(reader, address, pages))  # connect + warm-up
    nixl_s = [asyncio.run(_pull_all(reader, address, pages)) for _ in range(args.repeats)]
    parent.send("stop")
    owner.join(10)
    src = np.random.default_rng(1).integers(0, 255, total, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copy_s = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copy_s.append(time.perf_counter() - t0)
    nixl_gbps = total / statistics.median(nixl_s) / 1e9
    copy_gbps = total / statistics.median(copy_s) / 1e9
    out = {
        "bytes": total,
        "pages": pages,
        "page_bytes": LAYOUT.page_bytes,
        "nixl_s": nixl_s,
        "copy_s": copy_s,
        "nixl_gb_per_s": nixl_gbps,
        "copy_gb_per_s": copy_gbps,
        "ratio": nixl_gbps / copy_gbps,
    }
    print(f"  NIXL pull (other process, UCX)  {nixl_gbps:6.2f} GB/s  median of {args.repeats}")
    print(f"  in-process numpy copy            {copy_gbps:6.2f} GB/s")
    print(f"[kv-transfer] NIXL / copy = {out['ratio']:.2f} (target >= 0.40)")
    print(f"[kv-transfer] wrote {results.write('kv-transfer', None, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
