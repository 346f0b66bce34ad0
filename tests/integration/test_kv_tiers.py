"""L2 <-> L3 over NIXL's POSIX backend, and copy-on-write of shared pages."""

from __future__ import annotations

import numpy as np
import pytest

from kv_store.disk import DiskTier
from kv_store.layout import PageLayout
from kv_store.transfer import PagePool

LAYOUT = PageLayout(num_layers=2, num_kv_heads=2, head_dim=32, page_tokens=16, dtype="float16")


def _bytes(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 255, LAYOUT.page_bytes, dtype=np.uint8)


async def test_demote_to_disk_and_promote_back(tmp_path):
    pool = PagePool("tiers-l2", LAYOUT, 4)
    disk = DiskTier("tiers-l3", pool, tmp_path / "l3.pages", 16)
    try:
        for i in range(4):
            pool.put(f"p{i}", _bytes(i))
        for i in range(4):
            await disk.demote(f"p{i}")
        assert all(pool.get(f"p{i}") is None for i in range(4)) and all(f"p{i}" in disk for i in range(4))
        for i in range(4):
            pool.put(f"q{i}", _bytes(100 + i))  # the pool's slots are reused meanwhile
        pool.free("q0")
        slot = await disk.promote("p2")
        assert np.array_equal(pool.page(slot), _bytes(2))
        assert np.array_equal(pool.get("q1"), _bytes(101))  # neighbours untouched
        with pytest.raises(MemoryError):
            await disk.promote("p3")  # pool full again: the caller must evict first
    finally:
        disk.close()


def test_copy_on_write_keeps_the_shared_original():
    pool = PagePool("cow", LAYOUT, 4)
    pool.put("prefix", _bytes(1))
    pool.share("prefix")  # two sessions use it
    mine = pool.writable("prefix", "s1/prefix")
    assert mine == "s1/prefix"
    pool.get(mine)[:16] = 0  # session 1 appends / writes its copy
    assert np.array_equal(pool.get("prefix"), _bytes(1))
    # The other session is now the only user: it writes in place.
    assert pool.writable("prefix", "s2/prefix") == "prefix"
    pool.release("prefix")
    assert pool.get("prefix") is None
