"""Block <-> page moves (torch path): a gather of any blocks from either engine layout, scattered
into an empty cache, puts back exactly those blocks and touches no other."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import kv_pages


def _cache(layout: str, blocks: int, tokens: int, heads: int, dim: int, dtype) -> torch.Tensor:
    shape = (blocks, heads, tokens, 2 * dim) if layout == "cpu" else (2, blocks, tokens, heads, dim)
    return torch.randn(shape).to(dtype)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["cpu", "flash"]),
    st.integers(1, 3),
    st.sampled_from([16, 32]),
    st.integers(1, 4),
    st.sampled_from([32, 64]),
    st.sampled_from([torch.float32, torch.float16]),
    st.data(),
)
def test_gather_then_scatter_moves_exactly_the_chosen_blocks(layout, layers, tokens, heads, dim, dtype, data):
    blocks = 8
    ids = data.draw(st.lists(st.integers(0, blocks - 1), min_size=1, max_size=blocks, unique=True))
    src = [_cache(layout, blocks, tokens, heads, dim, dtype) for _ in range(layers)]
    dst = [torch.zeros_like(t) for t in src]
    views = [kv_pages.block_view(t, tokens, heads, dim) for t in src]
    pages = kv_pages.gather(views, torch.tensor(ids))
    assert pages.shape == (len(ids), layers, 2, tokens, heads, dim)
    kv_pages.scatter([kv_pages.block_view(t, tokens, heads, dim) for t in dst], torch.tensor(ids), pages)
    for s, d in zip(views, [kv_pages.block_view(t, tokens, heads, dim) for t in dst], strict=True):
        for b in range(blocks):
            assert torch.equal(d[b], s[b]) if b in ids else not d[b].any()


def test_cpu_view_puts_keys_before_values_per_head():
    # vLLM's CPU cache reads [blocks, heads, 2*tokens, dim]: K rows first, then V rows.
    t = torch.arange(1 * 2 * 4 * 2 * 3, dtype=torch.float32).view(1, 2, 4, 6)
    v = kv_pages.block_view(t, 4, 2, 3)
    kv = t.view(1, 2, 8, 3)
    assert torch.equal(v[0, 0, :, 1], kv[0, 1, :4]) and torch.equal(v[0, 1, :, 1], kv[0, 1, 4:])


def test_unknown_layout_is_refused():
    import pytest

    with pytest.raises(NotImplementedError, match="not a known block layout"):
        kv_pages.block_view(torch.zeros(3, 3, 3), 16, 2, 64)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["cpu", "flash"]), st.sampled_from([torch.float32, torch.float16]), st.data())
def test_triton_gather_scatter_equal_the_reference(layout, dtype, data):
    from kernels import triton_kv_pages

    tokens, heads, dim, blocks = 16, 2, 32, 6
    ids = torch.tensor(data.draw(st.lists(st.integers(0, blocks - 1), min_size=1, max_size=4, unique=True)))

    def views(caches):
        return [kv_pages.block_view(c, tokens, heads, dim) for c in caches]

    src = views([_cache(layout, blocks, tokens, heads, dim, dtype) for _ in range(2)])
    pages = triton_kv_pages.gather(src, ids)
    assert torch.equal(pages, kv_pages.gather_reference(src, ids))
    got = [torch.zeros_like(_cache(layout, blocks, tokens, heads, dim, dtype)) for _ in range(2)]
    want = [torch.zeros_like(c) for c in got]
    triton_kv_pages.scatter(views(got), ids, pages)
    kv_pages.scatter_reference(views(want), ids, pages)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
