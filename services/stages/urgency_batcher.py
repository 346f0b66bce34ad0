"""Calls of many streams in one model forward, most urgent first: a vocoder replica's chunks.

Callers `await batcher.run(session, item)`; a dispatcher takes the most urgent waiting item — the
replica's urgency policy orders them, as the urgency gate does its steps
(services/stages/urgency_gate.py) — and up to `max_batch` - 1 more that are `alike` it (the same
shape: one forward, no padding), most urgent first, and runs the model on them at once in a thread,
at most `slots` batches at a time; items of another shape (a stream's first chunk) go in the next
batch, on the next slot, not after this one's forward. Chunk-aligned dispatch: a batched talker writes every stream's chunk in
the same step, so their vocoder calls arrive within a few milliseconds of each other; a batch that
is not full waits up to `wait_s` after its first call for them (SGLang-Omni measured batching that
did not wait at +3% served, aligned at +53%). With `max_batch` 1 it is the urgency gate over calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from services.models.stream_loop import StepStats
from services.playback.board import BoardView
from services.policies.urgency.base import UrgencyPolicy
from services.stages.urgency_gate import most_urgent_first


@dataclass(eq=False)  # calls are told apart by identity (their items may be arrays)
class _Call:
    session: str
    item: Any
    arrival: float = field(default_factory=time.time)
    result: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class UrgencyBatcher:
    def __init__(
        self,
        policy: UrgencyPolicy,
        views: Callable[[], dict[str, BoardView]],
        run: Callable[[list[Any]], list[Any]],
        max_batch: int,
        slots: int,
        wait_s: float,
        on_batch: Callable[[StepStats], None] | None = None,
        alike: Callable[[Any], Hashable] = lambda item: None,
    ):
        if max_batch < 1 or slots < 1:
            raise ValueError("a batcher needs a batch of at least one and at least one slot")
        self.policy, self.views, self._run = policy, views, run
        self.max_batch, self.wait_s, self.on_batch, self.alike = max_batch, wait_s, on_batch, alike
        self._free = asyncio.Semaphore(slots)
        self._waiting: list[_Call] = []
        self._dispatcher: asyncio.Task | None = None
        self._forwards: set[asyncio.Task] = set()

    async def run(self, session: str, item: Any) -> Any:
        """The model's result for `item` (its exception, if the forward failed)."""
        call = _Call(session, item)
        self._waiting.append(call)
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.create_task(self._dispatch())
        try:
            return await call.result
        except asyncio.CancelledError:
            if call in self._waiting:  # not dispatched yet: it is not run
                self._waiting.remove(call)
            raise

    async def _dispatch(self) -> None:
        try:
            while self._waiting:
                await self._dispatch_one()
        except Exception as e:  # the policy or the board failed: the waiting calls fail, not hang
            for call in self._waiting:
                if not call.result.done():
                    call.result.set_exception(e)
            self._waiting = []
            raise

    async def _dispatch_one(self) -> None:
        await self._free.acquire()
        try:
            if len(self._waiting) < self.max_batch and self.wait_s > 0:
                # the rest of the talker step's chunks are on their way
                await asyncio.sleep(max(0.0, self._waiting[0].arrival + self.wait_s - time.time()))
            self._waiting = [c for c in self._waiting if not c.result.done()]  # cancelled meanwhile
            if not self._waiting:
                self._free.release()
                return
            order = most_urgent_first(
                self.policy, self.views(), [(c.arrival, c.session) for c in self._waiting]
            )
        except BaseException:
            self._free.release()
            raise
        shape = self.alike(self._waiting[order[0]].item)
        batch = [self._waiting[i] for i in order if self.alike(self._waiting[i].item) == shape][
            : self.max_batch
        ]
        self._waiting = [c for c in self._waiting if c not in batch]
        task = asyncio.create_task(self._forward(batch))
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

    async def _forward(self, batch: list[_Call]) -> None:
        try:
            start = time.time()
            waited = [start - c.arrival for c in batch]
            try:
                results = await asyncio.to_thread(self._run, [c.item for c in batch])
            except Exception as e:  # the calls of a failed forward fail, the replica goes on
                results = [e] * len(batch)
            if self.on_batch is not None:
                self.on_batch(StepStats(len(batch), time.time() - start, waited))
            for call, result in zip(batch, results, strict=True):
                if call.result.done():
                    continue
                if isinstance(result, Exception):
                    call.result.set_exception(result)
                else:
                    call.result.set_result(result)
        finally:
            self._free.release()
