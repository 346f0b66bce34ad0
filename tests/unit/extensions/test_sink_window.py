"""The bounded session KV's block bookkeeping: vLLM's block pool driven through SinkWindowManager
as a request grows, against the blocks the sink + window attention reads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.core.block_pool import BlockPool

from kernels import sink_attention
from services.extensions.vllm import sink_window

BLOCK = 16


def _manager(sinks: int, window: int, num_blocks: int = 512):
    spec = sink_window.SinkWindowSpec(
        block_size=BLOCK,
        num_kv_heads=1,
        head_size=16,
        dtype=torch.float32,
        sliding_window=window + 1,  # vLLM's window counts the query itself
        sink_tokens=sinks,
    )
    pool = BlockPool(num_blocks, enable_caching=False, hash_block_size=BLOCK)
    manager = sink_window.SinkWindowManager(
        spec, block_pool=pool, enable_caching=False, kv_cache_group_id=0, scheduler_block_size=BLOCK
    )
    return manager, pool


@settings(max_examples=60, deadline=None)
@given(
    sinks=st.integers(0, 70),
    window=st.integers(1, 90),
    steps=st.lists(st.integers(1, 40), min_size=1, max_size=25),
)
def test_resident_blocks_are_sinks_plus_window_and_cover_what_attention_reads(sinks, window, steps):
    manager, pool = _manager(sinks, window)
    free_at_start = pool.get_num_free_blocks()
    length = 0
    for step in steps:  # a chunk of `step` new tokens, then the engine frees behind the window
        manager.allocate_new_blocks("r", length + step, length + step)
        length += step
        manager.remove_skipped_blocks("r", length)
        held = [i for i, b in enumerate(manager.req_to_blocks["r"]) if not b.is_null]
        assert held == sink_window.resident_blocks(length, BLOCK, sinks, window)
        assert len(held) <= sink_window.max_resident_blocks(BLOCK, sinks, window)
        assert free_at_start - pool.get_num_free_blocks() == len(held)
        # Every block the next query (position `length`) and the next chunk read is resident.
        nxt = sink_attention._visited_blocks(length + 1, BLOCK, sinks, window, length)
        assert set(nxt) <= set(held) | {length // BLOCK}


@given(sinks=st.integers(0, 200), window=st.integers(1, 300), length=st.integers(1, 5000))
def test_resident_blocks_bound_and_degenerate_cases(sinks, window, length):
    held = sink_window.resident_blocks(length, BLOCK, sinks, window)
    assert held == sorted(set(held))
    assert len(held) <= sink_window.max_resident_blocks(BLOCK, sinks, window)
    assert held[-1] == (length - 1) // BLOCK  # the block being written is always there
    if sinks + window >= length:  # nothing has left the window yet: every block is resident
        assert held == list(range(-(-length // BLOCK)))


@pytest.mark.parametrize("isa", sink_window._TRANSPOSED_K_ISAS)
def test_cache_views_read_what_vllm_cpu_attention_wrote(isa):
    from vllm import _custom_ops as ops

    blocks, kv_heads, block, head, n = 4, 2, 32, 32, 70
    cache = torch.zeros(blocks, kv_heads, block, 2 * head)
    k_area, v_area = cache.view(blocks, kv_heads, 2 * block, head).chunk(2, dim=2)
    key, value = torch.randn(n, kv_heads, head), torch.randn(n, kv_heads, head)
    slots = torch.arange(n, dtype=torch.int64) + block  # from block 1 on
    ops.cpu_attn_reshape_and_cache(
        key, value, k_area, v_area, slots, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto"
    )
    k, v = sink_window.cpu_cache_views(cache)
    assert torch.equal(k.reshape(-1, kv_heads, head)[block : block + n], key)
    assert torch.equal(v.reshape(-1, kv_heads, head)[block : block + n], value)
