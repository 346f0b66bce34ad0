"""A continuous-batching step loop for a streaming speech model: one thread per model (per replica)
that advances every admitted stream whose next input is there in one forward.

- **Admission.** A stream submitted to the loop waits until one of the model's `max_streams` slots is
  free and it can start (e.g. its first token is there); the waiting ones start in the order the
  `order` hook gives (the stage's urgency policy), by submission otherwise.
- **Steps.** Each step takes the admitted streams that are ready (`Stream.poll`), at most
  `step_batch` of them (1: one stream per forward, the serial baseline), least recently stepped
  first, and runs `StepModel.step` on them: new ones join (their prefill) in it, and every one
  gets a frame or its end. Streams join and leave between steps, never inside one.
- **Waits are bounded.** A stream whose input does not come within its `timeout` fails with
  TimeoutError; one that fails (its input's error, its prefill) fails alone; a cancelled one
  (`Stream.cancel`, a barge-in) leaves at the next step boundary and frees its slot at once.
- **Output.** A stream's frames go to its outbox as the step ends (`async_output`: a second thread
  hands them over — the device-to-host copy included — while the next step runs).

The loop knows nothing of the model: `StepModel` does the forwards, `Stream` the input and output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class End:
    """A stream's last word from the model: why it ended (the model's own reasons, e.g. codec_eos)."""

    reason: str


class StepModel(Protocol):
    def step(self, streams: list[Stream]) -> list[Any]:
        """One forward for `streams` (new ones join first): per stream, its frame (anything the
        stream's consumer takes; `output` turns it into what is handed over) or an `End`. A stream
        that cannot go on raises for itself by returning the exception instead."""

    def leave(self, stream: Stream) -> None:
        """The stream is done (ended, failed or cancelled): free what it holds."""

    def output(self, frame: Any) -> Any:
        """A frame as its consumer takes it (e.g. on the host); run off the step when output is async."""


class Outbox:
    """What a stream's consumer reads: frames, then None (the end) or an exception; readable from
    a thread (`get`) or from an event loop (`aget`), written by the loop's threads."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self._lock = threading.Condition()
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def put(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            self._lock.notify_all()
            wake = self._wake
        if wake is not None:
            loop, event = wake
            with contextlib.suppress(RuntimeError):  # its event loop has closed: nobody reads any more
                loop.call_soon_threadsafe(event.set)

    def get(self) -> Any:
        with self._lock:
            self._lock.wait_for(lambda: bool(self._items))
            return self._items.popleft()

    async def aget(self) -> Any:
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                if self._wake is None:
                    self._wake = (asyncio.get_running_loop(), asyncio.Event())
                event = self._wake[1]
                event.clear()
            await event.wait()


class Stream:
    """The loop's side of a stream; models subclass it with their input (and their per-stream state
    in `state`, set by the model when the stream joins)."""

    def __init__(self) -> None:
        self.outbox = Outbox()
        self.state: Any = None  # the model's, from its join to its leave
        self.ended_by = ""
        self.timeout: float | None = None
        self.cancelled = False
        # Whose it is, for an `order` hook (a realtime session's urgency), and since when.
        self.session = ""
        self.arrival = time.time()
        self._loop: StreamLoop | None = None
        self._waiting_since: float | None = None
        self._last_step = 0.0

    # ---- the input side ---------------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the next step can run now (its input is there); raises what the input failed with."""
        raise NotImplementedError

    def waiting_for(self) -> str:
        """What the stream waits for (TimeoutError's message)."""
        return "its input"

    def changed(self) -> None:
        """The input changed (more came, or its end): wake the loop."""
        if self._loop is not None:
            self._loop.wake()

    def cancel(self) -> None:
        """The consumer is gone (a barge-in, a closed client): leave at the next step boundary."""
        self.cancelled = True
        self.changed()

    # ---- the output side --------------------------------------------------------------------------

    def frames(self, timeout: float | None = None) -> Iterator[Any]:
        """Submit the stream (once) and yield its frames as the loop writes them; `timeout` bounds
        each wait for its input. Raises what the stream failed with."""
        self._start(timeout)
        while (item := self.outbox.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def aframes(self, timeout: float | None = None) -> AsyncIterator[Any]:
        """`frames` for an event loop: waits without a thread."""
        self._start(timeout)
        while (item := await self.outbox.aget()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    def _start(self, timeout: float | None) -> None:
        if self._loop is None:
            self.timeout = timeout
            self.loop().submit(self)

    def loop(self) -> StreamLoop:
        """The loop this stream is stepped by (its model's)."""
        raise NotImplementedError

    def _poll(self, now: float) -> bool:
        """`ready`, with the wait bounded by the stream's timeout."""
        if self.ready():
            self._waiting_since = None
            return True
        if self._waiting_since is None:
            self._waiting_since = now
        elif self.timeout is not None and now - self._waiting_since > self.timeout:
            raise TimeoutError(f"{self.waiting_for()} did not come within {self.timeout} s")
        return False

    def _wake_at(self) -> float | None:
        if self._waiting_since is None or self.timeout is None:
            return None
        return self._waiting_since + self.timeout


@dataclass(frozen=True)
class StepStats:
    """What one batched forward of a speech model served (the stage turns it into metrics)."""

    streams: int  # streams (or chunks) in the forward
    seconds: float  # the forward
    waited_s: list[float]  # waits of those that got their slot (or batch) with it


class StreamLoop:
    def __init__(
        self,
        model: StepModel,
        name: str,
        max_streams: int,
        step_batch: int | None = None,
        async_output: bool = True,
        cpu_threads: int = 1,
        order: Callable[[list[Stream]], list[Stream]] | None = None,
        on_step: Callable[[StepStats], None] | None = None,
    ):
        if max_streams < 1:
            raise ValueError("a stream loop needs at least one slot")
        self.model, self.name, self.max_streams = model, name, max_streams
        self.step_batch = min(step_batch or max_streams, max_streams)
        self.order = order
        self.on_step = on_step
        self.cpu_threads = cpu_threads
        self._cond = threading.Condition()
        self._waiting: list[tuple[float, Stream]] = []  # (submitted, stream)
        self._active: list[Stream] = []
        self._wakeups = 0
        self._thread: threading.Thread | None = None
        self._out: queue.SimpleQueue | None = queue.SimpleQueue() if async_output else None

    # ---- callers' side ---------------------------------------------------------------------------

    def submit(self, stream: Stream) -> None:
        with self._cond:
            stream._loop = self
            self._waiting.append((time.monotonic(), stream))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self.name}-steps", daemon=True)
                self._thread.start()
                if self._out is not None:
                    threading.Thread(target=self._hand_over, name=f"{self.name}-output", daemon=True).start()
            self._wakeups += 1
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._wakeups += 1
            self._cond.notify_all()

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    # ---- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        torch.set_num_threads(self.cpu_threads)  # this thread's own: OpenMP's settings are per thread
        with torch.inference_mode():
            while True:
                batch, admitted = self._next_batch()
                start = time.perf_counter()
                try:
                    outputs = self.model.step(batch)
                except Exception as e:  # a forward that fails fails the streams in it, not the loop
                    log.exception("%s: a step of %d streams failed", self.name, len(batch))
                    outputs = [e] * len(batch)
                seconds = time.perf_counter() - start
                now = time.monotonic()
                for stream, out in zip(batch, outputs, strict=True):
                    stream._last_step = now
                    if isinstance(out, End):
                        stream.ended_by = out.reason
                        self._finish(stream, None)
                    elif isinstance(out, BaseException):
                        self._finish(stream, out)
                    else:
                        self._emit(stream, out)
                if self.on_step is not None:
                    try:
                        self.on_step(StepStats(len(batch), seconds, admitted))
                    except Exception:  # metrics never stop the loop
                        log.exception("%s: reporting a step failed", self.name)

    def _next_batch(self) -> tuple[list[Stream], list[float]]:
        """Blocks until some streams can step: the admitted ready ones (new ones admitted first
        where slots are free), at most `step_batch`, least recently stepped first."""
        with self._cond:
            while True:
                seen = self._wakeups
                now = time.monotonic()
                self._drop_cancelled()
                admitted = self._admit(now)
                ready = []
                for stream in list(self._active):
                    try:
                        if stream._poll(now):
                            ready.append(stream)
                    except BaseException as e:  # its input failed or timed out: it alone ends
                        self._active.remove(stream)
                        self._finish(stream, e)
                if ready:
                    ready.sort(key=lambda s: s._last_step)
                    return ready[: self.step_batch], [w for s, w in admitted if s in ready[: self.step_batch]]
                if seen == self._wakeups:
                    wakes = [t for s in self._active + [s for _, s in self._waiting] if (t := s._wake_at())]
                    self._cond.wait(timeout=max(min(wakes) - now, 0.001) if wakes else None)

    def _admit(self, now: float) -> list[tuple[Stream, float]]:
        """Waiting streams into free slots, in the `order` hook's order (submission otherwise)."""
        admitted: list[tuple[Stream, float]] = []
        if not self._waiting or len(self._active) >= self.max_streams:
            self._fail_expired_waiting(now)
            return admitted
        streams = [s for _, s in self._waiting]
        if self.order is not None:
            try:
                streams = self.order(streams)
            except Exception:  # a failing policy admits in submission order rather than stop the loop
                log.exception("%s: the order hook failed", self.name)
        since = {id(s): t for t, s in self._waiting}
        for stream in streams:
            if len(self._active) >= self.max_streams:
                break
            try:
                ready = stream._poll(now)
            except BaseException as e:
                self._waiting = [(t, s) for t, s in self._waiting if s is not stream]
                self._finish(stream, e)
                continue
            if ready:
                self._waiting = [(t, s) for t, s in self._waiting if s is not stream]
                self._active.append(stream)
                admitted.append((stream, now - since[id(stream)]))
        return admitted

    def _fail_expired_waiting(self, now: float) -> None:
        """A stream queued for a slot still has its input wait bounded."""
        for t, stream in list(self._waiting):
            try:
                stream._poll(now)
            except BaseException as e:
                self._waiting.remove((t, stream))
                self._finish(stream, e)

    def _drop_cancelled(self) -> None:
        for stream in [s for s in self._active if s.cancelled]:
            self._active.remove(stream)
            self._finish(stream, None)
        for t, stream in [(t, s) for t, s in self._waiting if s.cancelled]:
            self._waiting.remove((t, stream))
            stream.outbox.put(None)

    def _finish(self, stream: Stream, error: BaseException | None) -> None:
        """The stream leaves: its slot is freed, its consumer gets its end (after its frames)."""
        with self._cond:
            if stream in self._active:
                self._active.remove(stream)
            self._wakeups += 1
        if stream.state is not None:
            try:
                self.model.leave(stream)
            finally:
                stream.state = None
        self._deliver(stream, error)

    def _emit(self, stream: Stream, frame: Any) -> None:
        if self._out is not None:
            self._out.put((stream, frame, False))
        else:
            stream.outbox.put(self.model.output(frame))

    def _deliver(self, stream: Stream, error: BaseException | None) -> None:
        if self._out is not None:
            self._out.put((stream, error, True))
        else:
            stream.outbox.put(error)

    def _hand_over(self) -> None:
        """Async output: frames to their consumers (device-to-host included) while the next step runs."""
        while True:
            stream, item, last = self._out.get()
            if last:
                stream.outbox.put(item)
                continue
            try:
                stream.outbox.put(self.model.output(item))
            except Exception as e:
                stream.outbox.put(e)
