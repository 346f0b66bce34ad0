"""L2 page pool and page transfers over NIXL.

Each process that provides pages owns a `PagePool`: host DRAM cut into page-sized slots and
registered with NIXL once. It advertises itself (NIXL agent metadata, buffer base address, page
size) in Redis; a peer that misses a page READs it straight out of the owner's slot — the owner's CPU
does no copy. Transfers are progressed by polling `check_xfer_state` from the caller (an asyncio task
here), never by NIXL's background progress thread, which spins a core on CPU hosts.

Concurrent misses on one page are deduplicated: the first caller transfers, later callers await it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from kv_store.layout import PageLayout

# NIXL's UCX backend needs a TCP transport between processes on hosts without RDMA.
os.environ.setdefault("UCX_TLS", "tcp,sm,self")


def _nixl():
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError:  # the CUDA-12 wheel installs under its own name
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    return nixl_agent, nixl_agent_config


@dataclass(frozen=True)
class PoolAddress:
    """What a peer needs to read from a pool."""

    name: str
    metadata: bytes  # NIXL agent metadata
    base: int  # address of slot 0
    page_bytes: int

    def to_redis(self) -> dict[str, bytes]:
        return {
            "name": self.name.encode(),
            "metadata": self.metadata,
            "base": str(self.base).encode(),
            "page_bytes": str(self.page_bytes).encode(),
        }

    @classmethod
    def from_redis(cls, raw: dict) -> PoolAddress:
        raw = {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}
        return cls(raw["name"].decode(), raw["metadata"], int(raw["base"]), int(raw["page_bytes"]))


class TransferError(RuntimeError):
    pass


class PagePool:
    def __init__(
        self,
        name: str,
        layout: PageLayout,
        capacity_pages: int,
        backends: tuple[str, ...] = ("UCX",),
        timeout_s: float = 5.0,
    ):
        nixl_agent, nixl_agent_config = _nixl()
        self.name, self.layout, self.capacity = name, layout, capacity_pages
        self.timeout_s = timeout_s
        self.buffer = np.zeros(capacity_pages * layout.page_bytes, np.uint8)
        self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=list(backends)))
        self._base = self.buffer.ctypes.data
        self._reg = self.agent.register_memory([(self._base, self.buffer.nbytes, 0, "")], "DRAM")
        self._free = list(range(capacity_pages - 1, -1, -1))
        self._slot: dict[Hashable, int] = {}
        self._refs: dict[Hashable, int] = {}  # sessions sharing a page (copy-on-write)
        self._peers: dict[str, str] = {}  # pool name -> NIXL remote agent name
        self._inflight: dict[Hashable, asyncio.Future] = {}
        self.stats = {"pulled_pages": 0, "pulled_bytes": 0, "dedup_waits": 0}
        self._readers_until = 0.0  # monotonic time until which peers' reads are expected
        self._readers_expected = asyncio.Event()  # wakes an idle `serve` (binds to its loop on first wait)

    # ---- local slots ---------------------------------------------------------------------------

    def address(self) -> PoolAddress:
        return PoolAddress(self.name, self.agent.get_agent_metadata(), self._base, self.layout.page_bytes)

    def slot_of(self, page: Hashable) -> int | None:
        return self._slot.get(page)

    def arriving(self, page: Hashable) -> bool:
        """A pull into this page's slot is in flight: its bytes are not there yet."""
        return page in self._inflight

    @property
    def used(self) -> int:
        return len(self._slot)

    @property
    def full(self) -> bool:
        return not self._free

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def reserve(self, page: Hashable) -> int:
        """A slot for a page whose bytes another tier or peer is about to write."""
        return self._allocate(page)

    def _allocate(self, page: Hashable) -> int:
        if page in self._slot:
            return self._slot[page]
        if not self._free:
            raise MemoryError(f"pool {self.name} is full ({self.capacity} pages)")
        slot = self._slot[page] = self._free.pop()
        return slot

    def put(self, page: Hashable, data: np.ndarray) -> int:
        """Store a page's bytes; returns its slot."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if raw.nbytes != self.layout.page_bytes:
            raise ValueError(f"page has {raw.nbytes} bytes, the layout needs {self.layout.page_bytes}")
        slot = self._allocate(page)
        self.page(slot)[:] = raw
        return slot

    def page(self, slot: int) -> np.ndarray:
        size = self.layout.page_bytes
        return self.buffer[slot * size : (slot + 1) * size]

    def get(self, page: Hashable) -> np.ndarray | None:
        slot = self._slot.get(page)
        return None if slot is None else self.page(slot)

    def free(self, page: Hashable) -> None:
        slot = self._slot.pop(page, None)
        self._refs.pop(page, None)
        if slot is not None:
            self._free.append(slot)

    # ---- sharing -------------------------------------------------------------------------------

    def share(self, page: Hashable) -> None:
        """One more session uses this page (a shared prefix)."""
        if page not in self._slot:
            raise KeyError(page)
        self._refs[page] = self._refs.get(page, 1) + 1

    def release(self, page: Hashable) -> None:
        """A session stopped using the page; the last one frees it."""
        refs = self._refs.get(page, 1) - 1
        if refs <= 0:
            self.free(page)
        else:
            self._refs[page] = refs

    def writable(self, page: Hashable, private: Hashable) -> Hashable:
        """Before a session appends to `page`: the page itself when only this session uses it,
        else a private copy under the id `private` (copy-on-write; the others keep the original)."""
        if self._refs.get(page, 1) <= 1:
            return page
        self.page(self._allocate(private))[:] = self.page(self._slot[page])
        self.release(page)
        return private

    # ---- transfers -----------------------------------------------------------------------------

    def progress(self) -> None:
        """Let peers' reads of this pool proceed (UCX accepts connections and serves requests in
        the owner's worker progress). Owners call this on a timer, not in a spin."""
        self.agent.get_new_notifs()

    def expect_readers(self, for_s: float) -> None:
        """Peers will read this pool within `for_s` seconds (pages just handed off to a decode
        engine): `serve` progresses at its fast interval until then. Call on `serve`'s loop."""
        self._readers_until = max(self._readers_until, time.monotonic() + for_s)
        self._readers_expected.set()

    async def serve(self, interval_s: float = 0.001, idle_interval_s: float = 0.02) -> None:
        """Progress this pool for peers until cancelled: every `interval_s` while reads are expected
        (`expect_readers`), every `idle_interval_s` otherwise. A peer's first read sets up its UCX
        connection in a few owner progress rounds, and over TCP every read needs one; over shared
        memory a connected peer reads without the owner. A 1 ms tick costs an idle engine process
        ~3% of a core, so it runs only while a hand-off is being read."""
        while True:
            self.progress()
            if time.monotonic() < self._readers_until:
                await asyncio.sleep(interval_s)
                continue
            self._readers_expected.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._readers_expected.wait(), idle_interval_s)

    def connect(self, peer: PoolAddress) -> None:
        if peer.name not in self._peers:
            self._peers[peer.name] = self.agent.add_remote_agent(peer.metadata)

    async def pull(
        self, peer: PoolAddress, pages: list[tuple[Hashable, int]], poll_s: float = 0.0
    ) -> list[int]:
        """Read `pages` ((page id, slot in the peer's pool)) into local slots; returns the local
        slots. Pages already here or already being pulled by another caller are not read twice."""
        self.connect(peer)
        mine, waits = [], []
        for page, _ in pages:
            if page in self._slot and page not in self._inflight:
                continue
            if page in self._inflight:
                waits.append(self._inflight[page])
                self.stats["dedup_waits"] += 1
            else:
                mine.append(page)
        todo = [(p, s) for p, s in pages if p in set(mine)]
        if todo:
            done = asyncio.get_running_loop().create_future()
            for page, _ in todo:
                self._inflight[page] = done
            try:
                await self._read(peer, todo, poll_s)
                done.set_result(None)
            except BaseException as e:
                for page, _ in todo:
                    self.free(page)
                done.set_exception(e)
                done.exception()  # retrieved here: waiters re-raise it, none may be left
                raise
            finally:
                for page, _ in todo:
                    self._inflight.pop(page, None)
        for w in waits:
            await asyncio.shield(w)
        return [self._slot[p] for p, _ in pages]

    def _start(self, peer: PoolAddress, todo: list[tuple[Hashable, int]]):
        """Post a READ of `todo` into freshly allocated local slots; returns (handle, state).
        A peer that cannot be reached (its process died) raises TransferError at once."""
        size = self.layout.page_bytes
        local_slots = [self._allocate(page) for page, _ in todo]
        try:
            self.connect(peer)
            local = self.agent.get_xfer_descs([(self._base + s * size, size, 0) for s in local_slots], "DRAM")
            remote = self.agent.get_xfer_descs([(peer.base + s * size, size, 0) for _, s in todo], "DRAM")
            handle = self.agent.initialize_xfer("READ", local, remote, self._peers[peer.name])
            return handle, self.agent.transfer(handle)
        except Exception as e:  # NIXL raises its own error types (backend, remote disconnect)
            for page, _ in todo:
                self.free(page)
            self._forget(peer)
            raise TransferError(f"NIXL read of {len(todo)} pages from {peer.name} failed: {e}") from e

    def _forget(self, peer: PoolAddress) -> None:
        """Drop a peer's connection so a restarted process under the same name is met afresh."""
        remote = self._peers.pop(peer.name, None)
        if remote is not None:
            with contextlib.suppress(Exception):  # already gone on NIXL's side
                self.agent.remove_remote_agent(remote)

    def _release(self, handle, todo: list[tuple[Hashable, int]], ok: bool) -> None:
        with contextlib.suppress(Exception):  # a transfer abandoned mid-flight may refuse release
            self.agent.release_xfer_handle(handle)
        if not ok:
            for page, _ in todo:
                self.free(page)

    def _finish(self, handle, state: str, peer: PoolAddress, todo: list[tuple[Hashable, int]]) -> None:
        self._release(handle, todo, ok=state == "DONE")
        if state != "DONE":
            self._forget(peer)
            raise TransferError(f"NIXL read of {len(todo)} pages from {peer.name} ended in {state}")
        self.stats["pulled_pages"] += len(todo)
        self.stats["pulled_bytes"] += len(todo) * self.layout.page_bytes

    def _deadline(self, n_pages: int) -> float:
        # Generous: a live peer moves pages at GB/s; a dead one fails or never answers.
        return time.monotonic() + self.timeout_s + n_pages * self.layout.page_bytes / 100e6

    async def _read(self, peer: PoolAddress, todo: list[tuple[Hashable, int]], poll_s: float) -> None:
        handle, state = self._start(peer, todo)
        deadline = self._deadline(len(todo))
        try:
            while state not in ("DONE", "ERR") and time.monotonic() < deadline:
                await asyncio.sleep(poll_s)  # yields to the loop; the polling is the progress
                state = self.agent.check_xfer_state(handle)
        except BaseException:  # cancelled: the slots hold no complete page
            self._release(handle, todo, ok=False)
            raise
        self._finish(handle, state, peer, todo)

    def read_blocking(
        self, peer: PoolAddress, pages: list[tuple[Hashable, int]], poll_s: float = 0.0
    ) -> list[int]:
        """The synchronous fallback (no event loop): the same transfer, polled in place (every
        `poll_s`: a reader beside a busy thread in its process sleeps between polls)."""
        handle, state = self._start(peer, pages)
        deadline = self._deadline(len(pages))
        while state not in ("DONE", "ERR") and time.monotonic() < deadline:
            time.sleep(poll_s)
            state = self.agent.check_xfer_state(handle)
        self._finish(handle, state, peer, pages)
        return [self._slot[p] for p, _ in pages]
