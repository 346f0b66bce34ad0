"""The continuous-batching step loop (services/models/stream_loop.py) with a counting model: streams
join and leave between steps, every ready stream steps in one forward (at most `step_batch`), slots
bound the streams stepped at once and free at once when a stream is cancelled, a stream whose input
fails or stalls fails alone, and the `order` hook decides who gets a free slot."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from services.models.stream_loop import End, Stream, StreamLoop


class Counter(Stream):
    """Frames 0..length-1 once its input has come (`go`); `fail` makes its input raise."""

    def __init__(self, loop: StreamLoop, name: str, length: int, go: bool = True):
        super().__init__()
        self._l, self.name, self.length = loop, name, length
        self.go = threading.Event()
        self.error: BaseException | None = None
        if go:
            self.go.set()

    def loop(self) -> StreamLoop:
        return self._l

    def ready(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.go.is_set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.changed()


class CountingModel:
    def __init__(self, slots: int):
        self.free = list(range(slots))
        self.batches: list[list[str]] = []
        self.left: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def step(self, streams):
        self.gate.wait(5)
        self.batches.append([s.name for s in streams])
        out = []
        for s in streams:
            if s.state is None:
                s.state = {"slot": self.free.pop(0), "n": 0}
            if s.state["n"] == s.length:
                out.append(End("done"))
            else:
                out.append((s.name, s.state["n"]))
                s.state["n"] += 1
        return out

    def leave(self, stream):
        self.free.append(stream.state["slot"])
        self.left.append(stream.name)

    def output(self, frame):
        return frame


def _loop(slots=4, **kwargs) -> tuple[CountingModel, StreamLoop]:
    model = CountingModel(slots)
    return model, StreamLoop(model, "test", slots, **kwargs)


def _read_together(model: CountingModel, streams: list[Counter]) -> dict[str, list]:
    """Each stream read on a thread of its own, the first step held until all are submitted."""
    model.gate.clear()
    got: dict[str, list] = {}
    threads = [
        threading.Thread(target=lambda s=s: got.__setitem__(s.name, list(s.frames(5)))) for s in streams
    ]
    for t in threads:
        t.start()
    loop = streams[0].loop()
    deadline = time.monotonic() + 10
    while loop.queued + loop.active < len(streams) and time.monotonic() < deadline:
        time.sleep(0.01)  # every stream submitted (the first may be in the held step)
    model.gate.set()
    for t in threads:
        t.join(10)
    return got


@pytest.mark.parametrize("async_output", [True, False])
def test_ready_streams_step_together_and_each_gets_its_frames_in_order(async_output):
    model, loop = _loop(async_output=async_output)
    streams = [Counter(loop, f"s{i}", length=3 + i) for i in range(4)]
    got = _read_together(model, streams)
    for i, s in enumerate(streams):
        assert got[s.name] == [(s.name, n) for n in range(3 + i)]
        assert s.ended_by == "done"
    # after the first step (which may have caught only some) all four step in one forward
    assert max(len(b) for b in model.batches) == 4
    assert sorted(model.left) == ["s0", "s1", "s2", "s3"] and sorted(model.free) == [0, 1, 2, 3]


def test_step_batch_one_is_one_stream_per_forward_round_robin():
    model, loop = _loop(step_batch=1)
    streams = [Counter(loop, f"s{i}", length=4) for i in range(3)]
    outs = _read_together(model, streams)
    assert all(len(b) == 1 for b in model.batches)
    assert all(len(v) == 4 for v in outs.values())
    # least recently stepped first: no stream waits behind another's whole answer
    firsts = [model.batches.index([s.name]) for s in streams]
    assert max(firsts) < 3 + 2


def test_a_slot_bounds_the_streams_and_a_cancelled_stream_frees_it_at_once():
    model, loop = _loop(slots=1)
    long = Counter(loop, "long", length=10_000)
    short = Counter(loop, "short", length=2)
    frames = long.frames(5)
    assert next(frames) == ("long", 0)
    model.gate.clear()  # the next step of `long` is under way
    waiting = threading.Thread(target=lambda: list(short.frames(5)))
    waiting.start()
    time.sleep(0.1)
    assert "short" not in {n for b in model.batches for n in b}  # no slot for it yet
    long.cancel()  # a barge-in: it leaves when the step under way ends
    model.gate.set()
    waiting.join(5)
    assert not waiting.is_alive() and "long" in model.left and short.ended_by == "done"


def test_a_stream_whose_input_fails_or_stalls_fails_alone():
    model, loop = _loop()
    good = Counter(loop, "good", length=50)
    bad = Counter(loop, "bad", length=50, go=False)  # waiting for its input when it fails
    stalled = Counter(loop, "stalled", length=50, go=False)
    out: dict[str, object] = {}

    def consume(s):
        try:
            out[s.name] = len(list(s.frames(0.3)))
        except Exception as e:
            out[s.name] = e

    threads = [threading.Thread(target=consume, args=(s,)) for s in (good, bad, stalled)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    bad.fail(ConnectionError("the thinker went away"))
    for t in threads:
        t.join(10)
    assert out["good"] == 50
    assert isinstance(out["bad"], ConnectionError)
    assert isinstance(out["stalled"], TimeoutError)
    assert sorted(model.free) == [0, 1, 2, 3]


def test_the_order_hook_picks_who_gets_a_free_slot():
    model, loop = _loop(slots=1, order=lambda streams: sorted(streams, key=lambda s: s.name != "urgent"))
    holder = Counter(loop, "holder", length=10_000)
    first = holder.frames(5)
    next(first)
    model.gate.clear()
    late, urgent = Counter(loop, "late", length=1), Counter(loop, "urgent", length=1)
    threads = [threading.Thread(target=lambda s=s: list(s.frames(5))) for s in (late, urgent)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()  # the later one, but urgent
    time.sleep(0.1)
    holder.cancel()
    model.gate.set()
    for t in threads:
        t.join(5)
    stepped = [name for batch in model.batches for name in batch if name != "holder"]
    assert stepped.index("urgent") < stepped.index("late")  # the slot went to the urgent one first
    assert "late" not in [n for b in model.batches[: model.batches.index(["urgent"])] for n in b]


def test_a_forward_that_raises_fails_its_streams_and_the_loop_goes_on():
    model, loop = _loop()
    real = model.step

    def broken(streams):
        if any(s.name == "doomed" for s in streams):
            raise RuntimeError("kernel failed")
        return real(streams)

    model.step = broken
    doomed = Counter(loop, "doomed", length=3)
    with pytest.raises(RuntimeError):
        list(doomed.frames(5))
    assert list(Counter(loop, "after", length=2).frames(5)) == [("after", 0), ("after", 1)]


async def test_an_event_loop_reads_frames_without_a_thread():
    _, loop = _loop()
    streams = [Counter(loop, f"a{i}", length=5) for i in range(3)]

    async def read(s):
        return [f async for f in s.aframes(5)]

    got = await asyncio.wait_for(asyncio.gather(*(read(s) for s in streams)), 10)
    assert got == [[(s.name, n) for n in range(5)] for s in streams]


def test_a_failing_order_hook_or_step_report_does_not_stop_the_loop():
    def order(streams):
        raise RuntimeError("the board is gone")

    def report(stats):
        raise RuntimeError("metrics agent down")

    _, loop = _loop(order=order, on_step=report)
    assert list(Counter(loop, "a", length=3).frames(5)) == [("a", 0), ("a", 1), ("a", 2)]
    assert list(Counter(loop, "b", length=1).frames(5)) == [("b", 0)]
