"""A machine's cores shared by processor sharing, as Linux's scheduler shares them to first order:
with n runnable threads on k cores, each runs at min(1, k/n) of a core. Work is a job of CPU
seconds on one thread; a spinner is a thread that takes its share and does no work (a background
load: Ray's processes, idle replicas, an open session's streaming). On a
CPU machine with two cores this is what slows an engine's steps when the serving path runs beside
them, and the serving path when the engine runs (planner/calibrate.py measured it)."""

from __future__ import annotations

import simpy

EPS = 1e-9  # CPU seconds: work left below this is done (float rounding of the shares)


def work(env: simpy.Environment, cores: SharedCores | None, cpu_s: float) -> simpy.Event:
    """`cpu_s` of work on one thread of `cores`; without them, it never waits for a core."""
    return cores.run(cpu_s) if cores is not None else env.timeout(cpu_s)


class SharedCores:
    def __init__(self, env: simpy.Environment, cores: int):
        self.env, self.cores = env, cores
        self._jobs: dict[int, list] = {}  # id -> [CPU seconds left, done event]
        self._spinners = 0.0
        self._ids = 0
        self._at = env.now  # when the work left was last brought up to date
        self._generation = 0  # a wake-up scheduled before the last change is stale

    @property
    def rate(self) -> float:
        """Of a core, what each runnable thread gets now."""
        threads = len(self._jobs) + self._spinners
        return min(1.0, self.cores / threads) if threads else 1.0

    def run(self, cpu_s: float) -> simpy.Event:
        """`cpu_s` of work on one thread; the event fires when it is done."""
        done = self.env.event()
        if cpu_s <= 0:
            done.succeed()
            return done
        self._catch_up()
        self._ids += 1
        self._jobs[self._ids] = [cpu_s, done]
        self._reschedule()
        return done

    def spin(self, delta: float) -> None:
        """`delta` more (or, negative, fewer) polling threads; a fraction is a thread busy that part
        of the time (a background load)."""
        self._catch_up()
        self._spinners += delta
        assert self._spinners >= -EPS
        self._reschedule()

    def _catch_up(self) -> None:
        elapsed = self.env.now - self._at
        if elapsed > 0 and self._jobs:
            share = elapsed * self.rate
            for job in self._jobs.values():
                job[0] -= share
        self._at = self.env.now

    def _reschedule(self) -> None:
        self._generation += 1
        if self._jobs:
            first = min(job[0] for job in self._jobs.values())
            self.env.process(self._wake(max(0.0, first) / self.rate, self._generation))

    def _wake(self, delay: float, generation: int):
        yield self.env.timeout(delay)
        if generation != self._generation:
            return
        self._catch_up()
        for key in [k for k, job in self._jobs.items() if job[0] <= EPS]:
            self._jobs.pop(key)[1].succeed()
        self._reschedule()
