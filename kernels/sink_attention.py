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
import torch.nn.functional as F


def _visited_blocks(length: int, block: int, sinks: int, window: int, t_first: int) -> list[int]:
    """Blocks holding any key visible to queries at positions t_first..length-1: the sink blocks,
    then the window blocks (the kernels visit the same ones)."""
    n_sink = -(-min(sinks, length) // block)
    first_window = max(n_sink, max(t_first - window, 0) // block)
    return list(range(n_sink)) + list(range(first_window, (length - 1) // block + 1))


def _gather(cache: torch.Tensor, table: torch.Tensor, blocks: list[int]) -> torch.Tensor:
    return cache[table[blocks]].reshape(-1, *cache.shape[2:])  # [len(blocks) * block, kv_heads, dim]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [n, heads, dim], k/v [keys, kv_heads, dim] (gathered copies), allowed [n, keys] -> [n, heads, dim]."""
    # Keys no query may see are never used, whatever they hold (NaN included).
    unseen = ~allowed.any(0)
    k[unseen] = 0
    v[unseen] = 0
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    # The query heads of one kv head as rows of one attention: no copy of K/V per query head.
    qg = q.transpose(0, 1).reshape(kv_heads, group * n, dim)
    out = F.scaled_dot_product_attention(
        qg, k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed.repeat(group, 1), scale=scale
    )
    return out.reshape(heads, n, dim).transpose(0, 1)


def _sequence(q, k_cache, v_cache, table, length: int, sinks: int, window: int, scale: float) -> torch.Tensor:
    """Attention for one sequence's last len(q) queries, reading only the visited blocks."""
    block = k_cache.shape[1]
    positions = torch.arange(length - q.shape[0], length)
    blocks = _visited_blocks(length, block, sinks, window, int(positions[0]))
    key_pos = (torch.tensor(blocks)[:, None] * block + torch.arange(block)[None, :]).reshape(-1)
    allowed = allowed_keys(positions, key_pos, sinks, window)
    return _attend(q, _gather(k_cache, table, blocks), _gather(v_cache, table, blocks), allowed, scale)


def allowed_keys(positions: torch.Tensor, keys: int | torch.Tensor, sinks: int, window: int) -> torch.Tensor:
    """[n, keys] mask: key j is visible to the query at position t iff j ≤ t and (j < S or j ≥ t−W).
    `keys`: the key positions, or a count (positions 0..keys-1)."""
    j = (torch.arange(keys, device=positions.device) if isinstance(keys, int) else keys)[None, :]
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
        out[b] = _sequence(q[b : b + 1], k_cache, v_cache, block_table[b], length, sinks, window, scale)[0]
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
        if hi > lo:
            out[lo:hi] = _sequence(q[lo:hi], k_cache, v_cache, block_table[b], length, sinks, window, scale)
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
