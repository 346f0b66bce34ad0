"""Sink + window paged decode attention: time and bandwidth, against torch SDPA with an explicit mask.

On a GPU (`--device cuda`) it times the Triton kernel, reports the KV bandwidth it achieves (bytes of
KV it must read — sink and window blocks only — per second) as a share of the device's peak, and
times SDPA over the same sequences with the sink+window mask (which reads the whole KV). On CPU it
times the torch reference path (what serving uses there) against SDPA. Same shapes, same run.

    python -m loadtest.benchmarks.kernels_bench --device cpu
    python -m loadtest.benchmarks.kernels_bench --device cuda --peak-gbs 4800   # H200 HBM3e
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from kernels import sink_attention
from loadtest import results


def _time(fn, repeats: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(device: str, batch: int, heads: int, kv_heads: int, dim: int, length: int, sinks: int, window: int,
        block: int, dtype: torch.dtype, repeats: int) -> dict:  # fmt: skip
    gen = torch.Generator(device="cpu").manual_seed(0)
    per_seq = -(-length // block)
    k_cache = torch.randn(batch * per_seq, block, kv_heads, dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(batch * per_seq, block, kv_heads, dim, generator=gen).to(device, dtype)
    table = torch.arange(batch * per_seq, device=device).view(batch, per_seq)
    lens = torch.full((batch,), length, device=device)
    q = torch.randn(batch, heads, dim, generator=gen).to(device, dtype)
    scale = dim**-0.5
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    kernel = sink_attention.decode if device == "cuda" else sink_attention.decode_reference
    t_kernel = _time(lambda: kernel(q, k_cache, v_cache, table, lens, sinks, window, scale), repeats, sync)

    # SDPA over each whole (gathered) sequence with the sink + window mask.
    k = k_cache.view(batch, per_seq * block, kv_heads, dim)[:, :length].transpose(1, 2)
    v = v_cache.view(batch, per_seq * block, kv_heads, dim)[:, :length].transpose(1, 2)
    group = heads // kv_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    mask = sink_attention.allowed_keys(torch.tensor([length - 1], device=device), length, sinks, window)
    t_sdpa = _time(
        lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask, scale=scale),
        repeats,
        sync,
    )

    visited_blocks = min(-(-sinks // block), per_seq) + min(per_seq, window // block + 2)
    kv_bytes = batch * visited_blocks * block * kv_heads * dim * 2 * k_cache.element_size()
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "path": "triton" if device == "cuda" else "torch reference",
        "shape": dict(
            batch=batch,
            heads=heads,
            kv_heads=kv_heads,
            dim=dim,
            length=length,
            sinks=sinks,
            window=window,
            block=block,
            dtype=str(dtype),
        ),  # fmt: skip
        "kernel_s": t_kernel,
        "sdpa_masked_s": t_sdpa,
        "sdpa_over_kernel": t_sdpa / t_kernel,
        "kv_bytes_read": kv_bytes,
        "kernel_gbs": kv_bytes / t_kernel / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--sinks", type=int, default=64)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default=None)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--peak-gbs", type=float, default=None, help="device memory bandwidth, GB/s")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    data = run(args.device, args.batch, args.heads, args.kv_heads, args.dim, args.length, args.sinks,
               args.window, args.block, dtype, args.repeats)  # fmt: skip
    if args.peak_gbs:
        data["share_of_peak"] = data["kernel_gbs"] / args.peak_gbs
    print(
        f"{data['path']} on {data['device']}: {data['kernel_s'] * 1e3:.3f} ms "
        f"({data['kernel_gbs']:.1f} GB/s of sink+window KV"
        + (f", {data['share_of_peak']:.0%} of peak" if args.peak_gbs else "")
        + f"); SDPA with the mask: {data['sdpa_masked_s'] * 1e3:.3f} ms -> SDPA/kernel = {data['sdpa_over_kernel']:.2f}x"
    )
    print(f"results: {results.write('kernels', None, data)}")


if __name__ == "__main__":
    main()
