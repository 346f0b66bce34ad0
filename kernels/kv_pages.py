"""Moving KV between an engine's paged blocks (L1) and kv_store pages (L2).

A store page is layer x K/V x [page_tokens, kv_heads, head_dim] (`kv_store.layout.PageLayout`); an
engine keeps one tensor per layer in its attention backend's own block layout. `block_view` presents
any supported backend's tensor as [num_blocks, kv_parts, block_tokens, kv_heads, head_dim] without a
copy, so `gather`/`scatter` are backend-independent. `gather`/`scatter` use the Triton kernels
(`kernels/triton_kv_pages.py`) for CUDA tensors and the torch reference otherwise; the references
are the CPU path and the oracle for the kernels.
"""

from __future__ import annotations

import torch


def block_view(t: torch.Tensor, block_tokens: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """One layer's KV tensor as [num_blocks, 2, block_tokens, kv_heads, head_dim] (a view)."""
    if t.dim() == 4 and tuple(t.shape[1:]) == (num_kv_heads, block_tokens, 2 * head_dim):
        # vLLM CPU attention: [blocks, heads, block_tokens, 2*head_dim], read as [blocks, heads,
        # 2*block_tokens, head_dim] with K rows first, then V rows.
        return t.view(t.shape[0], num_kv_heads, 2, block_tokens, head_dim).permute(0, 2, 3, 1, 4)
    if t.dim() == 5 and t.shape[0] == 2 and tuple(t.shape[2:]) == (block_tokens, num_kv_heads, head_dim):
        # FlashAttention / Triton backends: [2, blocks, block_tokens, heads, head_dim].
        return t.permute(1, 0, 2, 3, 4)
    raise NotImplementedError(
        f"KV cache tensor of shape {tuple(t.shape)} is not a known block layout "
        f"(block {block_tokens}, {num_kv_heads} kv heads, head dim {head_dim})"
    )


def gather_reference(layers: list[torch.Tensor], block_ids: torch.Tensor) -> torch.Tensor:
    return torch.stack([layer[block_ids] for layer in layers], dim=1)


def scatter_reference(layers: list[torch.Tensor], block_ids: torch.Tensor, pages: torch.Tensor) -> None:
    for i, layer in enumerate(layers):
        layer[block_ids] = pages[:, i].to(layer.dtype)


def gather(layers: list[torch.Tensor], block_ids: torch.Tensor) -> torch.Tensor:
    """Blocks `block_ids` of every layer (views from `block_view`) as pages
    [n, layers, 2, block_tokens, kv_heads, head_dim]."""
    if layers[0].is_cuda:
        from kernels import triton_kv_pages

        return triton_kv_pages.gather(layers, block_ids)
    return gather_reference(layers, block_ids)


def scatter(layers: list[torch.Tensor], block_ids: torch.Tensor, pages: torch.Tensor) -> None:
    """Write pages [n, layers, 2, block_tokens, kv_heads, head_dim] into blocks `block_ids`."""
    if layers[0].is_cuda:
        from kernels import triton_kv_pages

        triton_kv_pages.scatter(layers, block_ids, pages.to(layers[0].device))
        return
    scatter_reference(layers, block_ids, pages)
