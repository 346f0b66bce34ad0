"""Encoder outputs over NIXL: an encoder replica's feature pool, and a thinker engine's reads of it.

An encoder replica writes each media item's features into a NIXL-registered host buffer as soon as
the item is encoded, and indexes the item in Redis under its key (the item's multimodal uuid in the
thinker's prompt). A thinker engine's EC connector (services/extensions/vllm/ec_connector.py) READs
the bytes straight out of that buffer — the KV store's page transfer (kv_store/transfer.py), its
pages a flat byte layout — so features reach prefill item by item, not whole through Ray's object
store after the last one.

Safety without locks: an item is never evicted before `hold_s` after it was written (longer than a
thinker waits for one), its index entry is deleted before its slots are reused, and a reader checks
after its read that the entry it read by is still there with the same nonce — a read that raced an
eviction is discarded (FeatureUnavailable), never handed on as features.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import numpy as np

from kv_store.layout import PageLayout
from kv_store.transfer import PagePool, PoolAddress, TransferError

PAGE_BYTES = 64 << 10
LAYOUT = PageLayout(
    num_layers=1, num_kv_heads=1, head_dim=PAGE_BYTES, page_tokens=1, dtype="uint8", kv_parts=1
)
INDEX = "omniray:ec:item:"  # + item key -> FeatureEntry (JSON)
POOLS = "omniray:ec:pool:"  # + pool name -> its PoolAddress (a hash)
_DTYPES = {"float32": np.float32, "float16": np.float16}


class FeatureUnavailable(RuntimeError):
    """An item's features cannot be read: not indexed (never written, expired, evicted), its owner
    unreachable, or evicted while it was read."""


@dataclass(frozen=True)
class FeatureEntry:
    pool: str
    slots: list[int]
    shape: list[int]
    dtype: str
    nonce: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(_DTYPES[self.dtype]).itemsize

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: bytes | str) -> FeatureEntry:
        return cls(**json.loads(raw))


def pages_for(nbytes: int) -> int:
    return max(1, -(-nbytes // PAGE_BYTES))


class FeaturePool:
    """The producer's side (an encoder replica): items written as they are encoded, kept at least
    `hold_s`, indexed for `ttl_s`, the oldest evicted first when room is needed."""

    def __init__(
        self,
        name: str,
        capacity_bytes: int,
        redis,
        hold_s: float = 120.0,
        ttl_s: float = 600.0,
        read_s: float = 2.0,
    ):
        if hold_s > ttl_s:
            raise ValueError("hold_s must not exceed ttl_s")
        self.name, self.redis, self.hold_s, self.ttl_s = name, redis, hold_s, ttl_s
        self.read_s = read_s  # how long after a write its reader is expected (the fast progress tick)
        self.pool = PagePool(name, LAYOUT, max(1, capacity_bytes // PAGE_BYTES))
        self._items: collections.OrderedDict[str, tuple[float, FeatureEntry]] = collections.OrderedDict()
        self._advertised = 0.0
        self._lock = threading.Lock()  # writers on worker threads (asyncio.to_thread)
        self.stats = {
            "written_items": 0,
            "written_bytes": 0,
            "evicted_items": 0,
            "refused_items": 0,
            "held_bytes": 0,
        }

    @property
    def capacity_bytes(self) -> int:
        return self.pool.capacity * PAGE_BYTES

    def fits(self, nbytes: int) -> bool:
        """Whether an item of `nbytes` can be written now (room free or freeable)."""
        need = pages_for(nbytes)
        now = time.monotonic()
        freeable = sum(len(e.slots) for at, e in self._items.values() if now - at >= self.hold_s)
        return need <= self.pool.free_slots + freeable

    def has(self, key: str) -> bool:
        return key in self._items

    def put(self, key: str, features: np.ndarray) -> bool:
        """Write `features` under `key` and index them (a key already here is only refreshed).
        False when there is no room even after evicting every item past its hold (not written)."""
        with self._lock:
            return self._put(key, features)

    def _put(self, key: str, features: np.ndarray) -> bool:
        if key in self._items:
            self._items.move_to_end(key)
            self.redis.set(INDEX + key, self._items[key][1].dumps(), ex=int(self.ttl_s))
            return True
        array = np.ascontiguousarray(features)
        dtype = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}.get(array.dtype)
        if dtype is None:
            raise TypeError(f"features of dtype {array.dtype} are not served over NIXL")
        raw = array.reshape(-1).view(np.uint8)
        need = pages_for(raw.nbytes)
        if not self._make_room(need):
            self.stats["refused_items"] += 1
            return False
        slots = []
        for i in range(need):
            slot = self.pool.reserve((key, i))
            chunk = raw[i * PAGE_BYTES : (i + 1) * PAGE_BYTES]
            self.pool.page(slot)[: chunk.nbytes] = chunk
            slots.append(slot)
        entry = FeatureEntry(self.name, slots, list(array.shape), dtype, uuid.uuid4().hex)
        self._items[key] = (time.monotonic(), entry)
        self.advertise()
        self.redis.set(INDEX + key, entry.dumps(), ex=int(self.ttl_s))
        self.stats["written_items"] += 1
        self.stats["written_bytes"] += raw.nbytes
        self.stats["held_bytes"] += raw.nbytes
        return True

    def expect_readers(self) -> None:
        """Items were just written: their readers come now (PagePool.expect_readers). Call on
        `serve`'s loop."""
        self.pool.expect_readers(self.read_s)

    def _make_room(self, need: int) -> bool:
        if need > self.pool.capacity:
            return False
        now = time.monotonic()
        while self.pool.free_slots < need and self._items:
            key, (at, entry) = next(iter(self._items.items()))
            if now - at < self.hold_s:
                return False
            # Unindexed before its slots are reused: a reader that finds the entry gone discards.
            with contextlib.suppress(Exception):
                self.redis.delete(INDEX + key)
            del self._items[key]
            self.stats["held_bytes"] -= entry.nbytes
            for i in range(len(entry.slots)):
                self.pool.free((key, i))
            self.stats["evicted_items"] += 1
        return self.pool.free_slots >= need

    def advertise(self, every_s: float = 10.0) -> None:
        """Where peers read this pool (re-published now and then: a Redis that restarted empty
        learns it again)."""
        now = time.monotonic()
        if now - self._advertised < every_s:
            return
        key = POOLS + self.name
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping=self.pool.address().to_redis())
        pipe.expire(key, int(self.ttl_s))
        pipe.execute()
        self._advertised = now

    async def serve(self) -> None:
        """Progress the pool for readers (PagePool.serve) and keep its address advertised."""
        server = asyncio.create_task(self.pool.serve())
        try:
            while True:
                await asyncio.sleep(5.0)
                with contextlib.suppress(Exception):  # Redis away: the next round re-advertises
                    await asyncio.to_thread(self.advertise)
        finally:
            server.cancel()


class FeatureReader:
    """The consumer's side (a thinker engine's worker): items read into its own NIXL pool, then out
    as arrays. Synchronous: it runs inside vLLM's model step."""

    def __init__(
        self, name: str, redis, landing_bytes: int = 64 << 20, timeout_s: float = 5.0, poll_s: float = 0.0002
    ):
        self.redis, self.poll_s = redis, poll_s
        self.pool = PagePool(name, LAYOUT, max(1, landing_bytes // PAGE_BYTES), timeout_s=timeout_s)
        self._peers: dict[str, PoolAddress] = {}
        self.stats = {"read_items": 0, "read_bytes": 0}

    def entry(self, key: str) -> FeatureEntry | None:
        raw = self.redis.get(INDEX + key)
        return None if raw is None else FeatureEntry.loads(raw)

    def _peer(self, name: str) -> PoolAddress:
        if name not in self._peers:
            raw = self.redis.hgetall(POOLS + name)
            if not raw:
                raise FeatureUnavailable(f"feature pool {name} is not advertised")
            self._peers[name] = PoolAddress.from_redis(raw)
        return self._peers[name]

    def read(self, key: str) -> np.ndarray:
        entry = self.entry(key)
        if entry is None:
            raise FeatureUnavailable(f"no features indexed under {key}")
        out = np.empty(len(entry.slots) * PAGE_BYTES, np.uint8)
        step = self.pool.capacity
        try:
            peer = self._peer(entry.pool)
            for at in range(0, len(entry.slots), step):
                part = [((key, at + i), s) for i, s in enumerate(entry.slots[at : at + step])]
                try:
                    local = self.pool.read_blocking(peer, part, self.poll_s)
                    for i, slot in enumerate(local):
                        out[(at + i) * PAGE_BYTES : (at + i + 1) * PAGE_BYTES] = self.pool.page(slot)
                finally:
                    for page, _ in part:
                        self.pool.free(page)
        except TransferError as e:
            self._peers.pop(entry.pool, None)  # a restarted owner advertises anew
            raise FeatureUnavailable(str(e)) from e
        again = self.entry(key)
        if again is None or again.nonce != entry.nonce:
            raise FeatureUnavailable(f"features under {key} were evicted while being read")
        self.stats["read_items"] += 1
        self.stats["read_bytes"] += entry.nbytes
        return out[: entry.nbytes].view(_DTYPES[entry.dtype]).reshape(entry.shape)
