"""Sink + window paged attention: the Triton kernels (under the interpreter on CPU) against the torch
references over many shapes, with every block outside [0, S) ∪ [t−W, t] filled with NaN; and the
references against torch SDPA where the mask degenerates (S = 0: a sliding window; W ≥ length: full
causal attention)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import sink_attention, triton_sink_attention

TOL = {torch.float32: 2e-5, torch.float16: 2e-2}


def _case(draw, n_queries):
    """A paged cache with distinct blocks per sequence; returns everything the kernels take."""
    batch = draw(st.integers(1, 3))
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 4]))
    dim = draw(st.sampled_from([16, 32]))
    block = draw(st.sampled_from([16, 32]))
    sinks = draw(st.integers(0, 40))
    window = draw(st.integers(0, 90))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    lens = [draw(st.integers(1, 130)) for _ in range(batch)]
    q_lens = [min(length, draw(st.integers(1, n_queries))) for length in lens]
    per_seq = -(-max(lens) // block)
    n_blocks = batch * per_seq + 3
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    k_cache = torch.randn(n_blocks, block, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(n_blocks, block, kv_heads, dim, generator=gen).to(dtype)
    table = torch.randperm(n_blocks, generator=gen)[: batch * per_seq].view(batch, per_seq)
    # Blocks no query of their sequence may read hold NaN: a kernel that reads one fails.
    for b, (length, nq) in enumerate(zip(lens, q_lens, strict=True)):
        positions = torch.arange(length - nq, length)
        seen = sink_attention.allowed_keys(positions, per_seq * block, sinks, window).any(0)
        for i in range(per_seq):
            if not seen[i * block : (i + 1) * block].any():
                k_cache[table[b, i]] = float("nan")
                v_cache[table[b, i]] = float("nan")
    return dict(
        heads=kv_heads * group, dim=dim, sinks=sinks, window=window, dtype=dtype, lens=torch.tensor(lens),
        q_lens=q_lens, k_cache=k_cache, v_cache=v_cache, table=table, gen=gen, scale=dim**-0.5,
    )  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_decode_kernel_equals_reference(data):
    c = _case(data.draw, 1)
    q = torch.randn(len(c["lens"]), c["heads"], c["dim"], generator=c["gen"]).to(c["dtype"])
    args = (q, c["k_cache"], c["v_cache"], c["table"], c["lens"], c["sinks"], c["window"], c["scale"])
    got = triton_sink_attention.decode(*args)
    want = sink_attention.decode_reference(*args)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[c["dtype"]], rtol=TOL[c["dtype"]])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_prefill_kernel_equals_reference(data):
    c = _case(data.draw, 40)
    cu = torch.tensor([0, *torch.tensor(c["q_lens"]).cumsum(0).tolist()])
    q = torch.randn(int(cu[-1]), c["heads"], c["dim"], generator=c["gen"]).to(c["dtype"])
    args = (q, c["k_cache"], c["v_cache"], c["table"], cu, c["lens"], c["sinks"], c["window"], c["scale"])
    got = triton_sink_attention.prefill(*args)
    want = sink_attention.prefill_reference(*args)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[c["dtype"]], rtol=TOL[c["dtype"]])


def _sdpa(q, k, v, band: int | None):
    """torch SDPA with an explicit mask over one sequence's last len(q) positions."""
    n, length = q.shape[0], k.shape[0]
    t = torch.arange(length - n, length)[:, None]
    j = torch.arange(length)[None, :]
    mask = j <= t if band is None else (j <= t) & (j >= t - band)
    group = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1), v.repeat_interleave(group, 1).transpose(0, 1),
        attn_mask=mask, scale=q.shape[-1] ** -0.5,
    )  # fmt: skip
    return out.transpose(0, 1)


@pytest.mark.parametrize(("sinks", "window", "band"), [(0, 24, 24), (5, 500, None), (0, 500, None)])
def test_degenerate_masks_equal_sdpa(sinks, window, band):
    gen = torch.Generator().manual_seed(1)
    block, length, n = 16, 90, 30
    k_cache, v_cache = (
        torch.randn(8, block, 2, 32, generator=gen),
        torch.randn(8, block, 2, 32, generator=gen),
    )
    table = torch.arange(6).view(1, 6)
    q = torch.randn(n, 4, 32, generator=gen)
    cu, lens = torch.tensor([0, n]), torch.tensor([length])
    k = k_cache[table[0]].reshape(-1, 2, 32)[:length]
    v = v_cache[table[0]].reshape(-1, 2, 32)[:length]
    want = _sdpa(q, k, v, band)
    for fn in (sink_attention.prefill_reference, triton_sink_attention.prefill):
        torch.testing.assert_close(fn(q, k_cache, v_cache, table, cu, lens, sinks, window, 32**-0.5), want)


def test_launcher_picks_the_reference_on_cpu_and_kernels_refuse_small_tiles():
    q = torch.randn(1, 2, 16)
    cache = torch.randn(2, 16, 1, 16)
    out = sink_attention.decode(q, cache, cache, torch.tensor([[0, 1]]), torch.tensor([20]), 2, 4, 0.25)
    assert torch.equal(
        out,
        sink_attention.decode_reference(
            q, cache, cache, torch.tensor([[0, 1]]), torch.tensor([20]), 2, 4, 0.25
        ),
    )
    with pytest.raises(ValueError, match="power of two >= 16"):
        triton_sink_attention.decode(torch.randn(1, 2, 8), torch.randn(2, 16, 1, 8), torch.randn(2, 16, 1, 8),
                                     torch.tensor([[0, 1]]), torch.tensor([20]), 2, 4, 0.25)  # fmt: skip
