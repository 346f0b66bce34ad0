"""The store inside an engine process: one asyncio loop on a background thread owns the process's
`KvStore` (L2 pool, optional L3 disk tier, Redis metadata, eviction policy), renews its liveness in
Redis, and progresses NIXL for peers that read its pool. vLLM's connector calls it from the engine's
own thread with `run` (wait for the result) or `submit` (a future).

Redis down or stalled costs lookups and saves (counted, recomputed; kv_store/metadata.py), never the
agent: the heartbeat keeps trying, and re-advertises the pool's address each time, so a Redis that
restarts empty learns again where this process's pages can be read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import importlib
import json
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_store import eviction
from kv_store.disk import DiskTier
from kv_store.follower import FollowerParams, PlaybackFollower
from kv_store.layout import PageLayout
from kv_store.metadata import CHAIN_TTL_S, KvMetadata, MetadataUnavailable, connect
from kv_store.metrics import Recorder
from kv_store.store import KvStore
from kv_store.transfer import PagePool

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    """`kv_connector_extra_config` of the engine's KVTransferConfig."""

    redis_url: str
    llm_version: str  # root of every page hash: KV of another model never matches
    l2_bytes: int = 256 << 20
    l3_path: str = ""  # empty: no disk tier
    l3_bytes: int = 0
    policy: str = "lru"
    policy_params: dict[str, Any] = field(default_factory=dict)
    transfer_timeout_s: float = 5.0
    heartbeat_ttl_ms: int = 10_000
    serve_interval_s: float = 0.001  # the pool's progress tick while a hand-off is being read
    serve_idle_interval_s: float = 0.02  # ... and otherwise (PagePool.serve)
    hand_off_read_s: float = 2.0  # how long after a hand-off its reader is expected
    # Live session signals (kv_store/follower.py): "module:Class" of a board reader built as
    # Class(redis_url, interval_s) with `views()`; empty: none (no next-use feed, no preload).
    session_board: str = ""
    board_interval_s: float = 0.05
    follower: dict[str, Any] = field(default_factory=dict)  # FollowerParams
    session_chain_ttl_s: float = CHAIN_TTL_S  # a session's page chain expires this long after last use

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> AgentConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(extra) - known
        if unknown:
            raise ValueError(f"unknown kv_connector_extra_config keys: {sorted(unknown)}")
        return cls(**extra)


class StoreAgent:
    _instances: dict[str, StoreAgent] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, config: AgentConfig) -> StoreAgent:
        """The process's agent for this config (the scheduler and worker sides share it)."""
        key = json.dumps(dataclasses.asdict(config), sort_keys=True)
        with cls._lock:
            if key not in cls._instances:
                cls._instances[key] = cls(config)
            return cls._instances[key]

    def __init__(self, config: AgentConfig):
        self.config = config
        self.provider = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.recorder = Recorder()
        self.store: KvStore | None = None
        self.follower: PlaybackFollower | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="omniray-kv-agent", daemon=True)
        self._thread.start()
        self._tasks: list[asyncio.Task] = []

        async def metadata() -> KvMetadata:  # the client belongs to the agent's loop
            return KvMetadata(
                connect(config.redis_url), metrics=self.recorder, chain_ttl_s=config.session_chain_ttl_s
            )

        self.meta = self.run(metadata())

    def run(self, coro: Coroutine, timeout: float | None = 60.0) -> Any:
        return self.submit(coro).result(timeout)

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def lookup(self, chain: list[str]) -> int:
        """How many leading pages of `chain` live providers hold; 0 when the store cannot say within
        `transfer_timeout_s` (Redis down or stalled: the prompt is computed; counted as a lookup error)."""
        try:
            return self.run(self.meta.match(chain, live_only=True), timeout=self.config.transfer_timeout_s)
        except Exception as e:
            if not isinstance(e, MetadataUnavailable):  # an outage is logged once, by the metadata
                log.warning("KV store lookup failed (%s); computing the prompt", e)
            self.recorder.error("lookup")
            return 0

    def attach(self, layout: PageLayout) -> KvStore:
        """Create this process's pool for the engine's layout (the worker side, once)."""
        if self.store is not None:
            if self.store.pool.layout != layout:
                raise ValueError(f"agent already serves layout {self.store.pool.layout}, not {layout}")
            return self.store
        c = self.config
        pool = PagePool(
            f"kv-{self.provider}",
            layout,
            max(1, c.l2_bytes // layout.page_bytes),
            timeout_s=c.transfer_timeout_s,
        )
        disk = None
        if c.l3_path and c.l3_bytes:
            path = Path(c.l3_path) / f"{self.provider}.pages"
            disk = DiskTier(f"disk-{self.provider}", pool, path, max(1, c.l3_bytes // layout.page_bytes))
        extra = {"predict": self._predict} if c.policy == "next_use" else {}
        policy = eviction.create(c.policy, c.policy_params, **extra)
        self.store = KvStore(self.provider, pool, self.meta, policy, disk=disk, metrics=self.recorder)
        board = None
        if c.session_board:
            module, name = c.session_board.split(":")
            board = getattr(importlib.import_module(module), name)(c.redis_url, c.board_interval_s)
            self.follower = PlaybackFollower(self.store, FollowerParams(**c.follower))

        async def start() -> None:
            await self.store.advertise()
            await self.meta.heartbeat(self.provider, c.heartbeat_ttl_ms)
            self._tasks = [
                asyncio.create_task(pool.serve(c.serve_interval_s, c.serve_idle_interval_s)),
                asyncio.create_task(self._heartbeat()),
            ]
            if board is not None:
                self._tasks.append(asyncio.create_task(self._follow(board)))

        self.run(start())
        return self.store

    def _predict(self, page) -> float:
        return self.follower.predict(page) if self.follower else math.inf

    def saw(self, session: str, pages) -> None:
        """Pages of a session were saved or loaded here (runs on the agent's loop)."""
        if self.follower is not None:
            self.follower.saw(session, pages)

    async def _follow(self, board) -> None:
        while True:
            try:
                await self.follower.step(board.views())
            except Exception as e:  # signals are advice: the store works without them
                log.warning("session follower: %s", e)
            await asyncio.sleep(self.config.board_interval_s)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_ttl_ms / 3000)
            try:
                await self.store.advertise()
                await self.meta.heartbeat(self.provider, self.config.heartbeat_ttl_ms)
            except MetadataUnavailable:
                pass  # counted and logged by the metadata; the next beat tries again
