"""Eviction policies as plugins (plugins.Registry's shape): one module each with typed `PARAMS` and
`create()`, tests in tests/unit/kv_store/. The store picks one by name from its configuration."""

from __future__ import annotations

from kv_store.eviction.base import EvictionPolicy, PageInfo
from plugins import Registry

POLICIES: Registry[EvictionPolicy] = Registry(
    "eviction policy",
    {
        "lru": "kv_store.eviction.lru",
        "tinylfu": "kv_store.eviction.tinylfu",
        "greedy_dual_size": "kv_store.eviction.greedy_dual_size",
        "next_use": "kv_store.eviction.next_use",
    },
)
create = POLICIES.create

__all__ = ["POLICIES", "EvictionPolicy", "PageInfo", "create"]
