"""Triton kernels for sink + window paged attention (see `kernels/sink_attention.py` for the math,
the cache layout and the torch references they are tested against).

Each program walks the sink blocks, then the window blocks; blocks entirely outside [0, S) ∪ [t−W, t]
are never read, and inside a visited block masked positions are not loaded. Every `tl.dot` dimension
is ≥ 16 (query groups are padded to 16), so the same code compiles on a GPU; on CPU it runs under
TRITON_INTERPRET=1 (tests), never in serving.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tile(q, acc, m_i, l_i, K, V, blk, pos, t_rows, row_ok, col_ok, S, W, scale, kvh,
          stride_kb, stride_kt, stride_kh, offs_t, offs_d):  # fmt: skip
    """Online-softmax update with one KV block. q [M, D]; pos [BS] key positions; t_rows [M] query
    positions."""
    kv_off = blk * stride_kb + offs_t[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :]
    k = tl.load(K + kv_off, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + kv_off, mask=col_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale
    visible = (
        row_ok[:, None]
        & col_ok[None, :]
        & (pos[None, :] <= t_rows[:, None])
        & ((pos[None, :] < S) | (pos[None, :] >= t_rows[:, None] - W))
    )
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _attend(q, K, V, BT, b, kvh, L, t_lo, t_rows, row_ok, S, W, scale,
            stride_btb, stride_kb, stride_kt, stride_kh,
            M: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):  # fmt: skip
    """Visit the sink blocks, then the window blocks of queries at positions t_lo..max(t_rows)."""
    offs_t = tl.arange(0, BS)
    offs_d = tl.arange(0, D)
    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, D], tl.float32)
    t_hi = tl.max(tl.where(row_ok, t_rows, 0), 0)
    n_sink = tl.cdiv(tl.minimum(S, L), BS)
    for i in range(0, n_sink):
        blk = tl.load(BT + b * stride_btb + i)
        pos = i * BS + offs_t
        col_ok = (pos <= t_hi) & ((pos < S) | (pos >= t_lo - W))
        acc, m_i, l_i = _tile(q, acc, m_i, l_i, K, V, blk, pos, t_rows, row_ok, col_ok, S, W, scale, kvh,
                              stride_kb, stride_kt, stride_kh, offs_t, offs_d)  # fmt: skip
    w_first = tl.maximum(n_sink, tl.maximum(t_lo - W, 0) // BS)
    for i in range(w_first, t_hi // BS + 1):
        blk = tl.load(BT + b * stride_btb + i)
        pos = i * BS + offs_t
        col_ok = (pos <= t_hi) & (pos >= t_lo - W)
        acc, m_i, l_i = _tile(q, acc, m_i, l_i, K, V, blk, pos, t_rows, row_ok, col_ok, S, W, scale, kvh,
                              stride_kb, stride_kt, stride_kh, offs_t, offs_d)  # fmt: skip
    return acc / tl.where(l_i == 0, 1.0, l_i)[:, None]


@triton.jit
def _decode_kernel(Q, K, V, Out, BT, LENS, S, W, scale,
                   stride_qb, stride_qh, stride_ob, stride_oh, stride_btb, stride_kb, stride_kt, stride_kh,
                   GROUP: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):  # fmt: skip
    """One program per (sequence, kv head): the GROUP query heads sharing that kv head, padded to G_PAD."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    L = tl.load(LENS + b)
    t = L - 1
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    row_ok = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0
    )
    t_rows = tl.zeros([G_PAD], tl.int32) + t
    out = _attend(q, K, V, BT, b, kvh, L, t, t_rows, row_ok, S, W, scale,
                  stride_btb, stride_kb, stride_kt, stride_kh, G_PAD, D, BS)  # fmt: skip
    o_ptr = Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _prefill_kernel(Q, K, V, Out, BT, CU, LENS, S, W, scale,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_btb, stride_kb, stride_kt, stride_kh,
                    GROUP: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):  # fmt: skip
    """One program per (sequence, query head, tile of BM new queries)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    lo = tl.load(CU + b)
    n_q = tl.load(CU + b + 1) - lo
    if tile * BM >= n_q:
        return
    L = tl.load(LENS + b)
    rows = tile * BM + tl.arange(0, BM)
    row_ok = rows < n_q
    t_rows = L - n_q + rows
    offs_d = tl.arange(0, D)
    q_ptr = Q + (lo + rows)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr, mask=row_ok[:, None], other=0.0)
    out = _attend(q, K, V, BT, b, h // GROUP, L, L - n_q + tile * BM, t_rows, row_ok, S, W, scale,
                  stride_btb, stride_kb, stride_kt, stride_kh, BM, D, BS)  # fmt: skip
    o_ptr = Out + (lo + rows)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=row_ok[:, None])


def _check(q: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int, int]:
    heads, dim = q.shape[1], q.shape[2]
    block, kv_heads = k_cache.shape[1], k_cache.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not group over {kv_heads} kv heads")
    for name, n in (("head_dim", dim), ("block_size", block)):
        if n < 16 or n & (n - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot), got {n}")
    return heads // kv_heads, dim, block


def decode(q, k_cache, v_cache, block_table, seq_lens, sinks: int, window: int, scale: float) -> torch.Tensor:
    group, dim, block = _check(q, k_cache)
    block_table, seq_lens = block_table.to(torch.int32), seq_lens.to(torch.int32)
    out = torch.empty_like(q)
    grid = (q.shape[0], k_cache.shape[2])
    _decode_kernel[grid](
        q, k_cache, v_cache, out, block_table, seq_lens, sinks, window, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, G_PAD=max(16, triton.next_power_of_2(group)), D=dim, BS=block,
    )  # fmt: skip
    return out


def prefill(
    q,
    k_cache,
    v_cache,
    block_table,
    cu_seqlens_q,
    seq_lens,
    sinks: int,
    window: int,
    scale: float,
    block_m: int = 16,
) -> torch.Tensor:
    group, dim, block = _check(q, k_cache)
    block_table, seq_lens = block_table.to(torch.int32), seq_lens.to(torch.int32)
    cu_seqlens_q = cu_seqlens_q.to(torch.int32)
    out = torch.zeros_like(q)
    max_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if len(seq_lens) else 0
    grid = (len(seq_lens), q.shape[1], triton.cdiv(max(max_q, 1), block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_table, cu_seqlens_q, seq_lens, sinks, window, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, BM=block_m, D=dim, BS=block,
    )  # fmt: skip
    return out
