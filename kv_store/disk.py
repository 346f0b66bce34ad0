"""L3: pages on disk, moved to and from an L2 `PagePool` by NIXL's POSIX backend.

One preallocated file of page slots per tier, registered with NIXL once, like the pool's DRAM.
`demote` writes a page out of the pool (and frees its pool slot unless told to keep it); `promote`
reads it back into the pool. Progress is polled from the caller's event loop, as for pulls.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Hashable
from pathlib import Path

from kv_store.transfer import PagePool, TransferError, _nixl


class DiskTier:
    def __init__(self, name: str, pool: PagePool, path: Path, capacity_pages: int):
        nixl_agent, nixl_agent_config = _nixl()
        self.pool, self.capacity = pool, capacity_pages
        self.page_bytes = pool.layout.page_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, capacity_pages * self.page_bytes)
        self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=["POSIX"]))
        self.agent.register_memory([(pool.buffer.ctypes.data, pool.buffer.nbytes, 0, "")], "DRAM")
        self.agent.register_memory([(0, capacity_pages * self.page_bytes, self._fd, "")], "FILE")
        self._free = list(range(capacity_pages - 1, -1, -1))
        self._slot: dict[Hashable, int] = {}
        self.name = name

    @property
    def used(self) -> int:
        return len(self._slot)

    def __contains__(self, page: Hashable) -> bool:
        return page in self._slot

    async def _move(self, op: str, pool_slot: int, disk_slot: int) -> None:
        dram = self.agent.get_xfer_descs(
            [(self.pool.buffer.ctypes.data + pool_slot * self.page_bytes, self.page_bytes, 0)], "DRAM"
        )
        file = self.agent.get_xfer_descs([(disk_slot * self.page_bytes, self.page_bytes, self._fd)], "FILE")
        handle = self.agent.initialize_xfer(op, dram, file, self.name)
        try:
            state = self.agent.transfer(handle)
            while state not in ("DONE", "ERR"):
                await asyncio.sleep(0)
                state = self.agent.check_xfer_state(handle)
        finally:
            self.agent.release_xfer_handle(handle)
        if state == "ERR":
            raise TransferError(f"NIXL POSIX {op} of a page on {self.name} failed")

    async def demote(self, page: Hashable, keep_in_pool: bool = False) -> int:
        """Write a pool page to disk; returns its disk slot."""
        pool_slot = self.pool.slot_of(page)
        if pool_slot is None:
            raise KeyError(f"{page!r} is not in pool {self.pool.name}")
        if page not in self._slot:
            if not self._free:
                raise MemoryError(f"disk tier {self.name} is full ({self.capacity} pages)")
            self._slot[page] = self._free.pop()
            await self._move("WRITE", pool_slot, self._slot[page])
        if not keep_in_pool:
            self.pool.free(page)
        return self._slot[page]

    async def promote(self, page: Hashable) -> int:
        """Read a disk page back into the pool; returns its pool slot."""
        if (slot := self.pool.slot_of(page)) is not None:
            return slot
        disk_slot = self._slot[page]
        pool_slot = self.pool.reserve(page)
        try:
            await self._move("READ", pool_slot, disk_slot)
        except BaseException:
            self.pool.free(page)
            raise
        return pool_slot

    def drop(self, page: Hashable) -> None:
        if (slot := self._slot.pop(page, None)) is not None:
            self._free.append(slot)

    def close(self) -> None:
        os.close(self._fd)
