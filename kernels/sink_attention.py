"""Paged attention over attention sinks plus a sliding window (Metronome's bounded session KV).

Query at position t attends to keys in [0, S) ∪ [t−W, t]: the first S tokens of the sequence (the
sinks) and the last W+1 (the window, t itself included). FlashAttention's window primitive cannot
express the union. S = 0 is a plain sliding window; W ≥ t is full causal attention.

KV lives in the engine's paged cache: `k_cache`/`v_cache` are [num_blocks, block_size, kv_heads,
head_dim] and `block_table[b, i]` is the block holding tokens [i·block, (i+1)·block) of sequence b.
Grouped-query attention: query head h reads kv head h // (heads / kv_heads).

This module holds the torch references (the CPU path and the oracle) and the launchers, which pick
the Triton kernels (`kernels/triton_sink_attention.py`) for CUDA tensors.
"""

from __future__ import annotations

import torch


def _sequence_kv(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    block = cache.shape[1]
    blocks = table[: -(-length // block)]
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]  # [length, kv_heads, dim]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [n, heads, dim], k/v [length, kv_heads, dim], allowed [n, length] -> [n, heads, dim]."""
    group = q.shape[1] // k.shape[1]
    # Keys no query may see are never used, whatever they hold (NaN included).
    seen = allowed.any(0)
    k = torch.where(seen[:, None, None], k, 0).float().repeat_interleave(group, dim=1)
    v = torch.where(seen[:, None, None], v, 0).float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(scores, dim=-1), v).to(q.dtype)


def allowed_keys(positions: torch.Tensor, length: int, sinks: int, window: int) -> torch.Tensor:
    """[n, length] mask: key j is visible to the query at position t iff j ≤ t and (j < S or j ≥ t−W)."""
    j = torch.arange(length, device=positions.device)[None, :]
    t = positions[:, None]
    return (j <= t) & ((j < sinks) | (j >= t - window))


def decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: int,
    window: int,
    scale: float,
) -> torch.Tensor:
    """One new query per sequence (at position len−1). q [batch, heads, dim] -> [batch, heads, dim]."""
    out = torch.empty_like(q)
    for b, length in enumerate(seq_lens.tolist()):
        k = _sequence_kv(k_cache, block_table[b], length)
        v = _sequence_kv(v_cache, block_table[b], length)
        allowed = allowed_keys(torch.tensor([length - 1]), length, sinks, window)
        out[b] = _attend(q[b : b + 1], k, v, allowed, scale)[0]
    return out


def prefill_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    sinks: int,
    window: int,
    scale: float,
) -> torch.Tensor:
    """A chunk of new queries per sequence against its cached KV (the chunk's own keys already in the
    cache): sequence b's queries are q[cu[b]:cu[b+1]], at the last positions of its seq_lens[b] tokens.
    q [total, heads, dim] -> [total, heads, dim]."""
    out = torch.empty_like(q)
    for b, length in enumerate(seq_lens.tolist()):
        lo, hi = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        if hi == lo:
            continue
        k = _sequence_kv(k_cache, block_table[b], length)
        v = _sequence_kv(v_cache, block_table[b], length)
        positions = torch.arange(length - (hi - lo), length)
        out[lo:hi] = _attend(q[lo:hi], k, v, allowed_keys(positions, length, sinks, window), scale)
    return out


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda


def decode(q, k_cache, v_cache, block_table, seq_lens, sinks: int, window: int, scale: float) -> torch.Tensor:
    """Sink + window paged decode attention: the Triton kernel on a GPU, the reference on CPU."""
    if _use_triton(q):
        from kernels import triton_sink_attention

        return triton_sink_attention.decode(q, k_cache, v_cache, block_table, seq_lens, sinks, window, scale)
    return decode_reference(q, k_cache, v_cache, block_table, seq_lens, sinks, window, scale)


def prefill(
    q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, sinks: int, window: int, scale: float
) -> torch.Tensor:
    """Sink + window paged attention for a chunk of new queries per sequence."""
    if _use_triton(q):
        from kernels import triton_sink_attention

        return triton_sink_attention.prefill(
            q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, sinks, window, scale
        )
    return prefill_reference(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, sinks, window, scale)
