"""Eviction policies as plugins: one module each with a typed params model and `create()`, tests in
tests/unit/kv_store/. The store picks one by name from its configuration."""

from __future__ import annotations

import importlib

from kv_store.eviction.base import EvictionPolicy, PageInfo

POLICIES = {
    "lru": "kv_store.eviction.lru",
    "tinylfu": "kv_store.eviction.tinylfu",
    "greedy_dual_size": "kv_store.eviction.greedy_dual_size",
    "next_use": "kv_store.eviction.next_use",
}


def create(name: str, params: dict | None = None, **kwargs) -> EvictionPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown eviction policy {name!r}; known: {sorted(POLICIES)}")
    return importlib.import_module(POLICIES[name]).create(params or {}, **kwargs)


__all__ = ["POLICIES", "EvictionPolicy", "PageInfo", "create"]
