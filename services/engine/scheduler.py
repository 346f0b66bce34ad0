"""The interaction-aware scheduler: vLLM's scheduler (`scheduler_cls`) with the running requests
ranked each round by an urgency policy (services/engine/urgency/) from the session board (the
gateway's session monitor, through Redis). vLLM's own loop then runs them in that order — the most
urgent get the token budget first and the least urgent are preempted first — and requests the policy
holds back are left out of this round. With no telemetry (no board, or no realtime session among the
running requests) the order is vLLM's FCFS.

It derives from the bounded session KV's scheduler (services/engine/session_kv.py; vLLM's own when
that is off). Configured through vLLM's `additional_config["omniray_scheduler"]`: {"policy",
"params", "redis_url", "poll_s"}. Decision time and urgency classes are recorded for Prometheus (kv_store/metrics.py SPEC:
they ride the KV connector's stats to the serving process).
"""

from __future__ import annotations

import time

from services.engine import urgency
from services.engine.session_kv import BoundedKvScheduler
from services.sessions.board import BoardReader

CONFIG_KEY = "omniray_scheduler"
SESSION_ARG = "omniray_session"  # SamplingParams.extra_args key naming the request's session
HELD_IDLE_S = 0.005


class InteractionAwareScheduler(BoundedKvScheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = (self.vllm_config.additional_config or {}).get(CONFIG_KEY, {})
        self.urgency = urgency.create(cfg.get("policy", "liveserve"), cfg.get("params"))
        url = cfg.get("redis_url")
        self.board = BoardReader(url, float(cfg.get("poll_s", 0.05))) if url else None
        self.recorder = None  # the KV connector's recorder, when there is one (metrics channel)
        agent = getattr(self.connector, "agent", None)
        if agent is not None:
            self.recorder = agent.recorder

    def _rank(self) -> list:
        """Reorder self.running by urgency; returns the requests held back this round."""
        views = self.board.views() if self.board else {}
        sessions = [_session(r) for r in self.running]
        if not views or not any(s in views for s in sessions):
            return []
        candidates = [
            urgency.Candidate(r.arrival_time, r.num_computed_tokens, r.num_output_tokens, views.get(s))
            for r, s in zip(self.running, sessions, strict=True)
        ]
        ranking = self.urgency.rank(candidates, time.time(), self.kv_cache_manager.usage)
        if self.recorder is not None:
            for cls in set(ranking.classes):
                self.recorder.ranked(cls, ranking.classes.count(cls))
        running = self.running
        self.running = [running[i] for i in ranking.order]
        return [running[i] for i in ranking.held]

    def schedule(self, *args, **kwargs):
        started = time.perf_counter()
        held = self._rank() if self.running else []
        if self.recorder is not None and self.running:
            self.recorder.decision(self.urgency.name, time.perf_counter() - started)
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self.running.extend(held)  # they keep their KV and run in a later round
        if held and not out.total_num_scheduled_tokens:
            # Everything is held: without work the engine loop would spin on this core. The
            # playback frontier moves in real time; a few ms is nothing to a buffer of seconds.
            time.sleep(HELD_IDLE_S)
        return out


def _session(request) -> str | None:
    extra = request.sampling_params.extra_args if request.sampling_params else None
    return (extra or {}).get(SESSION_ARG)
