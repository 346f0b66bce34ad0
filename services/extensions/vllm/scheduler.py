"""omniray's vLLM scheduler (`scheduler_cls`): vLLM's own scheduler with independent hooks, each
switched on by its section of the engine payload (services/extensions/vllm/specs.py):

- `UrgencyOrder` ranks the running requests each round by an urgency policy
  (services/policies/urgency/) from the playback board (the gateways' playback monitors, through
  Redis). vLLM's own loop then runs them in that order — the most urgent get the token budget first
  and the least urgent are preempted first — and requests the policy holds back sit this round out.
  The waiting queue is put in the same order, so when the seats (max_num_seqs) are full the one that
  frees goes to the most urgent waiting request (a new turn before resumed well-buffered work),
  not the oldest. With no telemetry (no board, or no realtime session among the requests) the order
  is FCFS.
- `SinkWindowKv` (services/extensions/vllm/sink_window.py) bounds each request's resident KV to
  sinks + window.

Hooks compose: each sees the scheduler before and after vLLM's `schedule()`, and may rewrite the KV
cache config before the scheduler is built. The scheduler's own metrics (decision time, urgency
classes) are recorded here, in the engine-core process, and leave with vLLM's scheduler stats
(`make_stats`) for the front end's stat logger (services/extensions/vllm/stat_logger.py) — with or
without a KV connector.

Written for vLLM 0.32 (its `Scheduler` / `AsyncScheduler` API: `running`, `schedule()`,
`make_stats()`, `kv_cache_manager.usage`); tests/contracts/test_vllm_scheduler.py drives the real one.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any, Protocol

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from kv_store.metrics import Recorder
from services.extensions.vllm import engine_metrics, pins
from services.extensions.vllm.specs import EnginePayload, UrgencyPayload
from services.playback.board import BoardReader
from services.policies import urgency

pins.check(__name__)

SESSION_ARG = "omniray_session"  # SamplingParams.extra_args key naming the request's playback session
HELD_IDLE_S = 0.005


class Hook(Protocol):
    def kv_cache_config(self, config: Any, vllm_config: Any) -> Any:
        """The KV cache config the scheduler is built with (before vLLM's own constructor)."""
        ...

    def before(self, scheduler: OmnirayScheduler) -> list:
        """Before a round; returns running requests taken out of it (put back after the round)."""
        ...

    def after(self, scheduler: OmnirayScheduler, output: Any, held: list) -> None: ...


class UrgencyOrder:
    def __init__(self, policy: urgency.UrgencyPolicy, views: Callable[[], dict], recorder: Recorder):
        self.policy, self.views, self.recorder = policy, views, recorder

    @classmethod
    def of(cls, payload: UrgencyPayload, recorder: Recorder) -> UrgencyOrder:
        board = BoardReader(payload.board_url, payload.poll_s)
        return cls(urgency.create(payload.policy, payload.params), board.views, recorder)

    def kv_cache_config(self, config: Any, vllm_config: Any) -> Any:
        return config

    def before(self, scheduler: OmnirayScheduler) -> list:
        if not scheduler.running and len(scheduler.waiting) < 2:
            return []
        started = time.perf_counter()
        views = self.views()
        held = self._rank(scheduler, views)
        self._order_waiting(scheduler, views)
        self.recorder.record("decision", (self.policy.name,), time.perf_counter() - started)
        return held

    def _ranked(self, scheduler: OmnirayScheduler, requests: list, views: dict) -> urgency.Ranking | None:
        """The policy's ranking of `requests` (None without telemetry for any of them)."""
        sessions = [session_of(r) for r in requests]
        if not views or not any(s in views for s in sessions):
            return None
        candidates = [
            urgency.Candidate(r.arrival_time, r.num_computed_tokens, r.num_output_tokens, views.get(s))
            for r, s in zip(requests, sessions, strict=True)
        ]
        return self.policy.rank(candidates, time.time(), scheduler.kv_cache_manager.usage)

    def _rank(self, scheduler: OmnirayScheduler, views: dict) -> list:
        """Reorder scheduler.running by urgency; returns the requests held back this round."""
        running = scheduler.running
        ranking = self._ranked(scheduler, running, views) if running else None
        if ranking is None:
            return []
        for cls in set(ranking.classes):
            self.recorder.record("ranked", (cls,), ranking.classes.count(cls))
        scheduler.running = [running[i] for i in ranking.order]
        return [running[i] for i in ranking.held]

    def _order_waiting(self, scheduler: OmnirayScheduler, views: dict) -> None:
        """vLLM's FCFS waiting queue (a deque) in urgency order; what the policy would hold waits
        last (admission is not a round to sit out). A priority queue keeps its own order."""
        waiting = scheduler.waiting
        if len(waiting) < 2 or not isinstance(waiting, collections.deque):
            return
        queued = list(waiting)
        ranking = self._ranked(scheduler, queued, views)
        if ranking is None:
            return
        waiting.clear()
        waiting.extend(queued[i] for i in ranking.order + ranking.held)

    def after(self, scheduler: OmnirayScheduler, output: Any, held: list) -> None:
        if held and not output.total_num_scheduled_tokens:
            # Everything is held: without work the engine loop would spin on this core. The
            # playback frontier moves in real time; a few ms is nothing to a buffer of seconds.
            time.sleep(HELD_IDLE_S)


def session_of(request) -> str | None:
    extra = request.sampling_params.extra_args if request.sampling_params else None
    return (extra or {}).get(SESSION_ARG)


def hooks(payload: EnginePayload, recorder: Recorder) -> list[Hook]:
    from services.extensions.vllm.sink_window import SinkWindowKv

    out: list[Hook] = []
    if payload.sink_window is not None:
        out.append(SinkWindowKv(payload.sink_window))
    if payload.urgency is not None:
        out.append(UrgencyOrder.of(payload.urgency, recorder))
    return out


class OmnirayScheduler(AsyncScheduler):
    def __init__(self, *args, **kwargs):
        payload = EnginePayload.of(kwargs["vllm_config"])
        self.recorder = Recorder(engine_metrics.ENGINE_SPEC)
        self.hooks = hooks(payload, self.recorder)
        for hook in self.hooks:
            kwargs["kv_cache_config"] = hook.kv_cache_config(kwargs["kv_cache_config"], kwargs["vllm_config"])
        super().__init__(*args, **kwargs)

    def schedule(self, *args, **kwargs):
        held: list = []
        for hook in self.hooks:
            held.extend(hook.before(self))
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.running.extend(held)  # they keep their KV and run in a later round
        for hook in self.hooks:
            hook.after(self, output, held)
        return output

    def make_stats(self, *args, **kwargs):
        stats = super().make_stats(*args, **kwargs)
        if stats is not None:
            engine_metrics.attach(stats, self.recorder.drain())
        return stats
