"""omniray's vLLM scheduler (`scheduler_cls`): vLLM's own scheduler with independent hooks, each
switched on by its section of the engine payload (services/extensions/vllm/specs.py):

- `UrgencyOrder` orders the running requests each round by an urgency policy
  (services/policies/urgency/) from the playback board (the gateways' playback monitors, through
  Redis). vLLM's own loop then runs them in that order — the most urgent get the token budget first
  and the least urgent are preempted first under KV pressure — and requests the policy holds back sit
  this round out (keeping their seats). The waiting queue is put in the same order, so when the seats
  (max_num_seqs) are full the one that frees goes to the most urgent waiting request (a new turn
  before resumed well-buffered work), and an urgent arrival that finds no seat — or not the KV
  blocks its first chunk needs — preempts held or well-buffered ones (a held reply keeps its blocks
  through its playback: without this, a pool full of paced replies kept every new turn waiting, as
  the simulator found: docs/planner.md). While a new realtime turn is in either queue, the requests the policy says yield
  to it (LiveServe: well-buffered, refill not yet due) sit the round out too, so that the turn's
  steps are short. The order is an incremental plan (services/policies/urgency/plan.py): a round
  classifies only the requests that arrived, whose session's view changed or whose class ran out.
  With no telemetry (no board) the order is vLLM's (FCFS), and the plans start over when it
  returns. A fault in the policy's bookkeeping (a bug) is logged and costs a round's order, not the
  engine core: the plans start over.
- `SinkWindowKv` (services/extensions/vllm/sink_window.py) bounds each request's resident KV to
  sinks + window.
- With omniray's EC connector (services/extensions/vllm/ec_connector.py), a prefill chunk stops
  before the first streamed encoder output that has not arrived yet.

Every engine step's period while the engine is busy is recorded as its frame time (what one more
token of every running request costs in wall time): the decode stage hands it to the gateway with
each chunk, where realtime admission compares it with the audio a token yields
(services/policies/admission.py).

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
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from kv_store.metrics import Recorder
from services.extensions.vllm import engine_metrics, pins
from services.extensions.vllm.block_order import NextUseBlocks
from services.extensions.vllm.ec_connector import OmniEcConnector
from services.extensions.vllm.specs import EnginePayload, UrgencyPayload
from services.playback.board import BoardReader
from services.policies import urgency
from services.policies.urgency.plan import UrgencyPlan

pins.check(__name__)

log = logging.getLogger(__name__)

SESSION_ARG = "omniray_session"  # SamplingParams.extra_args key naming the request's playback session
HELD_IDLE_S = 0.005
EC_IDLE_S = 0.005  # a step with nothing to run while requests wait for streamed encoder features
FAULT_LOG_S = 60.0  # a failing urgency order logs at most this often


class Hook(Protocol):
    def kv_cache_config(self, config: Any, vllm_config: Any) -> Any:
        """The KV cache config the scheduler is built with (before vLLM's own constructor)."""
        ...

    def before(self, scheduler: OmnirayScheduler) -> list:
        """Before a round; returns running requests taken out of it (put back after the round)."""
        ...

    def after(self, scheduler: OmnirayScheduler, output: Any, held: list) -> None: ...


class UrgencyOrder:
    def __init__(self, policy: urgency.UrgencyPolicy, views: Callable[[], dict], recorder: Recorder,
                 refresh_s: float = 5.0, tokens_per_round: int = 1, clock: Callable[[], float] = time.time,
                 blocks: NextUseBlocks | None = None):  # fmt: skip
        self.policy, self.views, self.recorder, self.clock = policy, views, recorder, clock
        self.blocks = blocks  # the free KV blocks' next-use order (None: vLLM's LRU)
        self._plan = lambda: UrgencyPlan(policy, identify, progress, refresh_s, tokens_per_round)
        self.running, self.waiting = self._plan(), self._plan()
        self._fault_logged = -FAULT_LOG_S
        self._unplanned = False  # rounds ran without telemetry, unseen by the plans

    @classmethod
    def of(cls, payload: UrgencyPayload, recorder: Recorder, tokens_per_round: int) -> UrgencyOrder:
        board = BoardReader(payload.board_url, payload.poll_s)
        policy = urgency.create(payload.policy, payload.params, piece_tokens=payload.piece_tokens)
        blocks = NextUseBlocks(payload.block_order) if payload.block_order is not None else None
        return cls(policy, board.views, recorder, payload.refresh_s, tokens_per_round, blocks=blocks)

    def kv_cache_config(self, config: Any, vllm_config: Any) -> Any:
        return config

    def before(self, scheduler: OmnirayScheduler) -> list:
        if self.blocks is not None:
            self._order_blocks(scheduler)
        if not scheduler.running and len(scheduler.waiting) < 2:
            return []
        views = self.views()
        if not views:  # no telemetry: vLLM's own order (FCFS)
            self._unplanned = True
            return []
        if self._unplanned:  # requests generated in rounds the plans did not count: they start over
            self.running, self.waiting, self._unplanned = self._plan(), self._plan(), False
        started = time.perf_counter()
        now, occupancy = self.clock(), scheduler.kv_cache_manager.usage
        held: list = []
        try:
            scheduler.running, held = self.running.arrange(scheduler.running, views, now, occupancy)
            ordered = isinstance(scheduler.waiting, collections.deque) and bool(scheduler.waiting)
            if ordered:
                waiting = self.waiting.arrange(list(scheduler.waiting), views, now, occupancy)
            if self.policy.yields_from is not None and (self.running.turns or ordered and self.waiting.turns):
                self._yield(scheduler, held)
            if ordered:
                self._order_waiting(scheduler, views, now, occupancy, held, waiting)
        except Exception:
            # A fault of the policy's bookkeeping must not take the engine down, and every session
            # on it: this round runs in vLLM's order (what was held runs too), the plans start over.
            self.recorder.record("fault", (), 1.0)
            if time.monotonic() - self._fault_logged >= FAULT_LOG_S:
                self._fault_logged = time.monotonic()
                log.exception("urgency order failed; this round runs in vLLM's order, the plans start over")
            scheduler.running.extend(held)
            self.running, self.waiting = self._plan(), self._plan()
            return []
        self.recorder.record("decision", (self.policy.name,), time.perf_counter() - started)
        for cls, n in self.running.classes.items():
            if n:
                self.recorder.record("ranked", (cls,), n)
        return held

    def _order_blocks(self, scheduler: OmnirayScheduler) -> None:
        """The free KV blocks in next-use order before this round allocates (block_order.py)."""
        views = self.views()
        if not views:
            return
        for request in itertools.chain(scheduler.running, scheduler.waiting):
            if (session := session_of(request)) is not None:
                self.blocks.saw(session, request)
        try:
            self.blocks.reorder(scheduler, views, self.clock())
        except Exception:  # a bug here costs the order, never the engine: vLLM's LRU stands
            self.recorder.record("fault", (), 1.0)
            if time.monotonic() - self._fault_logged >= FAULT_LOG_S:
                self._fault_logged = time.monotonic()
                log.exception("block order failed; the free blocks keep vLLM's order")
        for to, n in self.blocks.moved.items():
            if n:
                self.recorder.record("reordered", (to,), n)
                self.blocks.moved[to] = 0

    def _yield(self, scheduler: OmnirayScheduler, held: list) -> None:
        """A turn is in the queues: the running requests that yield to it sit this round out beside
        the held ones, keeping their seats."""
        yielded = self.running.yielding(scheduler.running, held)  # least urgent first: preempted first
        if yielded:
            self.recorder.record("yielded", (), yielded)

    def _order_waiting(self, scheduler: OmnirayScheduler, views: dict, now: float, occupancy: float,
                       held: list, arranged: tuple[list, list]) -> None:  # fmt: skip
        """vLLM's FCFS waiting queue (a deque) in urgency order (`arranged` by the waiting plan this
        round), so the seat that frees goes to the most urgent; what the policy would hold waits last
        (admission is not a round to sit out). With the seats full, an urgent arrival takes a
        preemptible one's seat. A priority queue keeps its own order."""
        order, last = arranged
        if self._preempt_for(scheduler, order, held):
            order, last = self.waiting.arrange(list(scheduler.waiting), views, now, occupancy)
        scheduler.waiting.clear()
        scheduler.waiting.extend(order + last)

    def _preempt_for(self, scheduler: OmnirayScheduler, waiting: list, held: list) -> int:
        """Preempt less urgent preemptible requests — held ones first, then the end of the running
        order — for the urgent waiting ones that find no free seat or too few free KV blocks, as
        vLLM preempts under KV pressure: the blocks go back to the pool (and stay in its prefix
        cache: the resume recomputes only what was evicted meanwhile), the request goes back to
        waiting, and its id reaches the workers with this round's output (`preempted_req_ids`),
        which drop its state."""
        preemptible = self.policy.preemptible
        # Seats vLLM fills this round: held ones count as taken, requests holding KV while they
        # wait (`kv_holding_waiting`) are admitted first.
        free = scheduler.max_num_active_reqs - len(scheduler.running) - len(held)
        free -= scheduler.num_waiting_for_streaming_input + len(scheduler.kv_holding_waiting)
        blocks = free_blocks(scheduler)
        pool = list(held) + [
            r for r in reversed(scheduler.running) if self.running.class_of(r) in preemptible
        ]
        victims = []
        for arrival in waiting:
            if scheduler._is_blocked_waiting_status(arrival.status) or arrival in scheduler.deferred_waiting:
                continue  # vLLM will not admit it this round: no seat for it
            if self.waiting.class_of(arrival) in preemptible:
                break  # the rest of the queue is no more urgent than what it would preempt
            need = blocks_needed(scheduler, arrival)
            while free <= 0 or blocks < need:
                # an in-flight step may still write a candidate's blocks: vLLM waits for those too
                while pool and not scheduler._request_blocks_can_be_freed(pool[0]):
                    pool.pop(0)
                if not pool or self.running.key_of(pool[0]) <= self.waiting.key_of(arrival):
                    break
                victim = pool.pop(0)
                victims.append(victim)
                free += 1
                blocks += -(-victim.num_computed_tokens // scheduler.block_size)
                self.recorder.record("preempted", (self.waiting.class_of(arrival),), 1)
            if free <= 0 or blocks < need:
                break  # nothing less urgent is left to make room: it waits, and so does the rest
            free -= 1
            blocks -= need
        for victim in victims:
            (held if victim in held else scheduler.running).remove(victim)
            scheduler._preempt_request(
                victim, time.monotonic(), drop_stale_output=scheduler.requires_kv_delivery
            )
        return len(victims)

    def after(self, scheduler: OmnirayScheduler, output: Any, held: list) -> None:
        if held and not output.total_num_scheduled_tokens:
            # Everything is held: without work the engine loop would spin on this core. The
            # playback frontier moves in real time; a few ms is nothing to a buffer of seconds.
            time.sleep(HELD_IDLE_S)


def free_blocks(scheduler) -> int:
    """KV blocks a waiting request may take now: the pool's free ones (cached ones included: vLLM
    evicts them on demand) less the watermark vLLM keeps back from admissions."""
    manager = scheduler.kv_cache_manager
    return manager.block_pool.get_num_free_blocks() - getattr(manager, "watermark_blocks", 0)


def blocks_needed(scheduler, request) -> int:
    """New blocks a waiting request's first chunk takes: its tokens up to the step's budget, less
    what the prefix cache holds of them (a resumed or new request computes from there)."""
    cached = request.num_computed_tokens
    if not cached:
        cached = scheduler.kv_cache_manager.get_computed_blocks(request)[1]
    tokens = min(request.num_tokens, cached + scheduler.max_num_scheduled_tokens)
    size = scheduler.block_size
    return max(0, -(-tokens // size) - cached // size)


def identify(request) -> tuple[str | None, float]:
    """What an urgency plan reads once from a vLLM request."""
    return session_of(request), request.arrival_time


def progress(request) -> tuple[int, int]:
    """What an urgency plan reads from a vLLM request at each classification."""
    return request.num_computed_tokens, request.num_output_tokens


def session_of(request) -> str | None:
    extra = request.sampling_params.extra_args if request.sampling_params else None
    return (extra or {}).get(SESSION_ARG)


def hooks(payload: EnginePayload, recorder: Recorder, tokens_per_round: int = 1) -> list[Hook]:
    from services.extensions.vllm.sink_window import SinkWindowKv

    out: list[Hook] = []
    if payload.sink_window is not None:
        out.append(SinkWindowKv(payload.sink_window))
    if payload.urgency is not None:
        out.append(UrgencyOrder.of(payload.urgency, recorder, tokens_per_round))
    return out


class OmnirayScheduler(AsyncScheduler):
    def __init__(self, *args, **kwargs):
        payload = EnginePayload.of(kwargs["vllm_config"])
        self.recorder = Recorder(engine_metrics.ENGINE_SPEC)
        spec = kwargs["vllm_config"].speculative_config
        self.hooks = hooks(payload, self.recorder, 1 + (spec.num_speculative_tokens if spec else 0))
        self._busy_since: float | None = None  # when the last step of a busy run ended
        for hook in self.hooks:
            kwargs["kv_cache_config"] = hook.kv_cache_config(kwargs["kv_cache_config"], kwargs["vllm_config"])
        super().__init__(*args, **kwargs)

    def schedule(self, *args, **kwargs):
        held: list = []
        for hook in self.hooks:
            held.extend(hook.before(self))
        # Held requests keep their KV and their seats (the workers' batch is sized for the seats):
        # they run in a later round.
        self.max_num_active_reqs -= len(held)
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.max_num_active_reqs += len(held)
            self.running.extend(held)
        for hook in self.hooks:
            hook.after(self, output, held)
        if isinstance(self.ec_connector, OmniEcConnector):
            for outcome, seconds in self.ec_connector.waits:
                self.recorder.record("feature_waits", (outcome,), 1)
                self.recorder.record("feature_wait_s", (outcome,), seconds)
            self.ec_connector.waits.clear()
            if not output.total_num_scheduled_tokens and self.ec_connector.waiting:
                time.sleep(EC_IDLE_S)  # else the engine loop would spin on this core until they come
        self._count_prompt_tokens(output)
        return output

    def _try_schedule_encoder_inputs(
        self, request, num_computed_tokens: int, num_new_tokens: int, *args, **kwargs
    ):
        # Encoder outputs streamed over NIXL (ec_connector.py): compute up to the first not arrived.
        if isinstance(self.ec_connector, OmniEcConnector):
            bound = self.ec_connector.computable_tokens(request, num_computed_tokens)
            if bound is not None:
                num_new_tokens = min(num_new_tokens, bound)
        return super()._try_schedule_encoder_inputs(
            request, num_computed_tokens, num_new_tokens, *args, **kwargs
        )

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        now = time.perf_counter()
        if scheduler_output.total_num_scheduled_tokens and self._busy_since is not None:
            self.recorder.record("frame", (), now - self._busy_since)
        # A step without tokens (everything held) or an engine left with nothing to run ends the
        # busy run: the wait until the next step is not a frame.
        busy = scheduler_output.total_num_scheduled_tokens and (self.running or self.waiting)
        self._busy_since = now if busy else None
        return outputs

    def _count_prompt_tokens(self, output: Any) -> None:
        """Prompt tokens computed this step (vLLM has counted them into `num_computed_tokens`):
        a streaming-input request's later chunks too, which vLLM's own counter leaves out."""
        n = 0
        for req_id, scheduled in output.num_scheduled_tokens.items():
            if (r := self.requests.get(req_id)) is not None:
                n += max(0, min(scheduled, r.num_prompt_tokens - (r.num_computed_tokens - scheduled)))
        if n:
            self.recorder.record("prompt_computed", (), n)

    def make_stats(self, *args, **kwargs):
        stats = super().make_stats(*args, **kwargs)
        if stats is not None:
            engine_metrics.attach(stats, self.recorder.drain())
        return stats
