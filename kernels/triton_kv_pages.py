"""Triton kernels moving KV between an engine's paged blocks and kv_store pages (see
`kernels/kv_pages.py` for the layouts and the torch path they are tested against). One launch per
layer; the block side is addressed through its strides, so any backend's layout that
`kv_pages.block_view` understands works without a copy."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _move_kernel(BLOCKS, PAGES, IDS, layer, n_layers,
                 s_blk, s_part, s_tok, s_head, s_dim,
                 H: tl.constexpr, D: tl.constexpr, PAGE_ELEMS: tl.constexpr, CHUNK: tl.constexpr,
                 TO_PAGES: tl.constexpr):  # fmt: skip
    i = tl.program_id(0)  # which page / block id
    part = tl.program_id(1)  # K or V
    e = tl.program_id(2) * CHUNK + tl.arange(0, CHUNK)  # element of [tokens, heads, dim]
    ok = e < PAGE_ELEMS
    blk = tl.load(IDS + i)
    tok, head, dim = e // (H * D), (e // D) % H, e % D
    src = BLOCKS + blk * s_blk + part * s_part + tok * s_tok + head * s_head + dim * s_dim
    dst = PAGES + ((i * n_layers + layer) * 2 + part) * PAGE_ELEMS + e
    if TO_PAGES:
        tl.store(dst, tl.load(src, mask=ok), mask=ok)
    else:
        tl.store(src, tl.load(dst, mask=ok).to(BLOCKS.dtype.element_ty), mask=ok)


def _launch(layers: list[torch.Tensor], block_ids: torch.Tensor, pages: torch.Tensor, to_pages: bool) -> None:
    n = block_ids.numel()
    _, _, tokens, heads, dim = layers[0].shape
    elems = tokens * heads * dim
    chunk = min(1024, triton.next_power_of_2(elems))
    ids = block_ids.to(device=pages.device, dtype=torch.int32)
    for layer, view in enumerate(layers):
        _move_kernel[(n, 2, triton.cdiv(elems, chunk))](
            view, pages, ids, layer, len(layers), *view.stride(),
            H=heads, D=dim, PAGE_ELEMS=elems, CHUNK=chunk, TO_PAGES=to_pages,
        )  # fmt: skip


def gather(layers: list[torch.Tensor], block_ids: torch.Tensor) -> torch.Tensor:
    _, parts, tokens, heads, dim = layers[0].shape
    pages = torch.empty(
        (block_ids.numel(), len(layers), parts, tokens, heads, dim),
        dtype=layers[0].dtype,
        device=layers[0].device,
    )
    _launch(layers, block_ids, pages, to_pages=True)
    return pages


def scatter(layers: list[torch.Tensor], block_ids: torch.Tensor, pages: torch.Tensor) -> None:
    _launch(layers, block_ids, pages.contiguous(), to_pages=False)
