"""A thinker engine replica on the simulated clock, batching as vLLM's v1 scheduler does: seats
(`max_num_seqs`), a token budget per step (`max_num_batched_tokens`), chunked prefill, running
requests before waiting ones, KV pages allocated as a request grows and a running request preempted
(last admitted first, as vLLM's FCFS policy) when the pool has none left; a preempted request goes
back to the front of the waiting queue and recomputes what the prefix cache no longer holds.

Each step calls the engine's real urgency hook (`UrgencyOrder.before`, services/extensions/vllm/
scheduler.py) on this object, which offers what the hook reads of vLLM's scheduler: `running`,
`waiting`, `kv_cache_manager.usage`, `max_num_active_reqs`, `_preempt_request` and the rest. A step
costs what the hardware profile says (planner/costs.py): the decode step at the number of decoding
requests, plus the prefill curve's marginal cost of the step's prompt tokens (its intercept once,
where only prompt tokens run).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from types import SimpleNamespace

import simpy

from planner.costs import Serving, StageCosts
from planner.sim.cores import SharedCores, work
from planner.sim.kv import KvPool
from services.extensions.vllm.scheduler import SESSION_ARG

HELD_IDLE_S = 0.005  # every running request held: the real hook sleeps this long (HELD_IDLE_S)


def _tell(told: list) -> None:
    for r, what in told:
        if r.owner is not None:
            r.owner(r, what)


class SimRequest:
    """What the engine and the urgency hook read of a vLLM request. Hashed by identity."""

    def __init__(self, rid: str, session: str | None, prompt: int, max_tokens: int, arrival: float,
                 owner: Callable[[SimRequest, str], None] | None = None, chain: str | None = None):  # fmt: skip
        self.rid, self.session, self.prompt, self.max_tokens = rid, session, prompt, max_tokens
        self.chain = chain  # the conversation whose KV pages its prompt starts with (None: none)
        self.arrival_time = arrival
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.sampling_params = SimpleNamespace(extra_args={SESSION_ARG: session} if session else {})
        self.status = "waiting"
        self.owner = owner  # told "token" (one more output token), "finished" or "aborted"
        self.pages = 0  # KV pages it holds
        self.first_token_at: float | None = None
        self.preemptions = 0
        self._replayed = 0  # output tokens a preemption made part of the prompt to recompute

    @property
    def num_tokens(self) -> int:  # what vLLM's Request says: the tokens to have in KV before the next
        return self.prompt

    @property
    def prefilling(self) -> bool:
        return self.num_computed_tokens < self.prompt


class EngineReplica:
    def __init__(self, env: simpy.Environment, name: str, costs: StageCosts, kv: KvPool, *,
                 max_num_seqs: int, max_num_batched_tokens: int, order=None,
                 on_step: Callable[[float, int], None] | None = None,
                 cores: SharedCores | None = None, serving: Serving | None = None):  # fmt: skip
        self.env, self.name, self.costs, self.kv = env, name, costs, kv
        # where the serving path shares the machine's cores (Cluster.cores): the engine's steps take
        # their share, and a step's tokens reach their owners once the serving path has handled them
        # (Serving.step_cpu_s, token_cpu_s). Its processes do not poll between messages there: on a
        # CPU machine they nap (services/extensions/vllm/shm_wait.py).
        self.cores, self.serving = cores, serving
        self.max_num_active_reqs = max_num_seqs
        self.budget = self.max_num_scheduled_tokens = max_num_batched_tokens
        self.block_size = kv.page_tokens  # the hook counts KV in the pool's unit
        self.order = order  # UrgencyOrder, or None: vLLM's own order
        self.on_step = on_step  # (step seconds, decoding requests): frame-time observers (admission)
        self.running: list[SimRequest] = []
        self.waiting: collections.deque[SimRequest] = collections.deque()
        # what UrgencyOrder reads of vLLM's scheduler and this model never has
        self.num_waiting_for_streaming_input = 0
        self.kv_holding_waiting: list = []
        self.deferred_waiting: set = set()
        self.requires_kv_delivery = False
        self.kv_cache_manager = kv
        self.steps = self.busy_s = self.work_s = 0.0  # busy: seconds stepping; work: what the steps cost
        self._loading = 0.0  # host-tier loads the step being scheduled waits for
        self.preempted = 0
        self._wake = env.event()
        env.process(self._loop())

    # ---- what the urgency hook calls -------------------------------------------------------------

    def _is_blocked_waiting_status(self, status) -> bool:
        return False

    def _request_blocks_can_be_freed(self, request) -> bool:
        return True

    def _preempt_request(
        self, request: SimRequest, timestamp: float, drop_stale_output: bool = False
    ) -> None:
        self._free(request)
        # vLLM recomputes the outputs too, then samples the next token
        request.prompt += request.num_output_tokens - request._replayed
        request._replayed = request.num_output_tokens
        request.num_computed_tokens = 0
        request.status = "preempted"
        request.preemptions += 1
        self.preempted += 1
        self.waiting.appendleft(request)

    # ---- the API ---------------------------------------------------------------------------------

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def add(self, request: SimRequest) -> None:
        self.waiting.append(request)
        if not self._wake.triggered:
            self._wake.succeed()

    def abort(self, request: SimRequest) -> None:
        """The client went away (a barge-in): its seat and KV are freed at once."""
        if request in self.running:
            self.running.remove(request)
            self._free(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = "aborted"

    # ---- the loop --------------------------------------------------------------------------------

    def _free(self, request: SimRequest) -> None:
        self.kv.release(request)
        request.pages = 0

    def _grow(self, request: SimRequest, tokens: int) -> bool:
        """Pages for `tokens` in total; preempts from the end of the running queue when there are
        none left (never `request` itself: False then)."""
        need = math.ceil(tokens / self.kv.page_tokens) - request.pages
        while need > 0 and not self.kv.take(need):
            victim = next((r for r in reversed(self.running) if r is not request), None)
            if victim is None:
                return False
            self.running.remove(victim)
            self._preempt_request(victim, self.env.now)
        if need > 0:
            request.pages += need
        return True

    def _schedule(self, held: list) -> tuple[list, list, int]:
        """vLLM's order: the running requests (a token each, or a prefill chunk), then — unless a
        running one was preempted for pages this step — the waiting ones, while seats, budget and
        pages last."""
        decoding, prefill, budget = [], [], self.budget
        preempted = self.preempted
        for r in list(self.running):
            if budget <= 0:
                break
            if r not in self.running:  # preempted for another's pages this step
                continue
            n = min(r.prompt - r.num_computed_tokens, budget) if r.prefilling else 1
            if not self._grow(r, r.num_computed_tokens + n):
                continue
            (prefill if r.prefilling else decoding).append((r, n))
            budget -= n
        if self.preempted != preempted:  # one scheduled earlier may have been the victim
            decoding = [(r, n) for r, n in decoding if r.status == "running"]
            prefill = [(r, n) for r, n in prefill if r.status == "running"]
            return decoding, prefill, sum(n for _, n in decoding + prefill)
        seats = self.max_num_active_reqs - len(self.running) - len(held)
        while self.waiting and seats > 0 and budget > 0:
            r = self.waiting[0]
            if r.num_computed_tokens == 0:
                # pages on the host tier come back first (the KV connector's load, in the step)
                self._loading += self.kv.load_time(r)
                r.num_computed_tokens = self.kv.admit(r)  # prefix-cache hit
                r.pages = math.ceil(r.num_computed_tokens / self.kv.page_tokens)
            n = min(r.prompt - r.num_computed_tokens, budget) if r.prefilling else 1
            if not self._admit_pages(r, r.num_computed_tokens + n):
                break
            self.waiting.popleft()
            r.status = "running"
            self.running.append(r)
            (prefill if r.prefilling else decoding).append((r, n))
            budget -= n
            seats -= 1
        return decoding, prefill, self.budget - budget

    def _admit_pages(self, request: SimRequest, tokens: int) -> bool:
        """Pages for a waiting request: from the free and cached pages only (vLLM preempts for the
        running, never to admit)."""
        need = math.ceil(tokens / self.kv.page_tokens) - request.pages
        if need > 0 and not self.kv.take(need):
            return False
        request.pages += max(0, need)
        return True

    def step_cost(self, decoding: int, prompt_tokens: int, prefilling: int = 0) -> float:
        """Seconds of work of a step: `decoding` requests a token each, `prompt_tokens` of
        `prefilling` requests' prompts."""
        c = self.costs
        running = decoding + prefilling
        s = (
            self.serving.engine_step_s + running * self.serving.engine_request_s
            if self.serving is not None
            else 0.0
        )
        s += c.decode_step.at(decoding) if decoding else 0.0
        if prompt_tokens:
            s += c.prefill.at(prompt_tokens) - (c.prefill.intercept_s if decoding else 0.0)
        return s

    def _loop(self):
        while True:
            if not self.running and not self.waiting:
                self._wake = self.env.event()
                yield self._wake
                continue
            held = self.order.before(self) if self.order is not None else []
            decoding, prefill, tokens = self._schedule(held)
            self.running.extend(held)
            if not decoding and not prefill:
                yield self.env.timeout(HELD_IDLE_S)
                continue
            cost = self.step_cost(len(decoding), sum(n for _, n in prefill), len(prefill)) + self._loading
            self._loading = 0.0
            started = self.env.now
            yield work(self.env, self.cores, cost)
            took = self.env.now - started  # the work, or longer where the cores are shared
            self.steps += 1
            self.work_s += cost
            self.busy_s += took
            if self.on_step is not None:
                self.on_step(took, len(decoding))
            self._advance(decoding, prefill)

    def _advance(self, decoding: list, prefill: list) -> None:
        now = self.env.now
        told: list[tuple[SimRequest, str]] = []
        for r, n in prefill:
            if r.status != "running":
                continue  # aborted during the step
            r.num_computed_tokens += n
            if not r.prefilling:  # the last chunk samples the first token
                r.first_token_at = r.first_token_at or now
                self._token(r, told)
        for r, _ in decoding:
            if r.status == "running":
                r.num_computed_tokens += 1
                self._token(r, told)
        if self.serving is None or not told:
            _tell(told)
            return
        tokens = sum(what == "token" for _, what in told)
        handled = work(self.env, self.cores, self.serving.step_cpu_s + tokens * self.serving.token_cpu_s)
        handled.callbacks.append(lambda _: _tell(told))

    def _token(self, r: SimRequest, told: list) -> None:
        """One more output token: the engine's state now; its owner told after the step."""
        r.num_output_tokens += 1
        told.append((r, "token"))
        if r.num_output_tokens >= r.max_tokens and r.status == "running":
            self.running.remove(r)
            self._free(r)
            r.status = "finished"
            told.append((r, "finished"))
