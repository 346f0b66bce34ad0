"""Fixtures of the store's integration tests."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from kv_store.metadata import KvMetadata


@pytest.fixture
async def meta(redis_url):
    """The store's Redis metadata under a key prefix of its own (tests share one server)."""
    client = aioredis.Redis.from_url(redis_url)
    yield KvMetadata(client, prefix=f"t{uuid.uuid4().hex}")
    await client.aclose()
