"""Prometheus metrics of realtime sessions (exported through Ray as `ray_omniray_realtime_*`)."""

from __future__ import annotations

from ray.util import metrics

from services.common.telemetry import Gauge
from services.extensions.ray.metrics import zero


class RealtimeStats:
    def __init__(self):
        self.sessions = Gauge(
            "omniray_realtime_sessions",
            description="Open realtime sessions (WebSocket and gRPC) on this gateway replica.",
        )
        self.admission_limit = Gauge(
            "omniray_realtime_admission_limit",
            description="Realtime sessions the AIMD controller admits now (N*).",
        )
        self.admitted = metrics.Counter(
            "omniray_realtime_admitted_total",
            description="Realtime sessions admitted (opened under the admission limit).",
        )
        self.rejected = metrics.Counter(
            "omniray_realtime_rejected_total",
            description="Realtime sessions refused at the admission limit.",
        )
        self.barge_ins = metrics.Counter(
            "omniray_realtime_barge_ins_total",
            description="Speech that started over a response being generated or played.",
        )
        self.wasted = metrics.Counter(
            "omniray_realtime_wasted_tokens_total",
            description="Generated tokens the user never heard (cut by a barge-in).",
        )
        self.generated_tokens = metrics.Counter(
            "omniray_realtime_generated_tokens_total",
            description="Tokens generated for realtime responses.",
        )
        for counter in (self.rejected, self.barge_ins, self.wasted):  # exported at 0 until the first one
            zero(counter)

        self.ahead = metrics.Counter(
            "omniray_realtime_prefill_ahead_total",
            description="Speculative prefills of turns still being spoken, by outcome.",
            tag_keys=("outcome",),
        )
        self.ahead_tokens = metrics.Counter(
            "omniray_realtime_prefill_ahead_tokens_total",
            description="Prompt tokens prefilled while the user was still speaking.",
        )
        for outcome in ("done", "failed", "cancelled"):
            zero(self.ahead, outcome=outcome)
        zero(self.ahead_tokens)

        self.history_dropped = metrics.Counter(
            "omniray_realtime_history_turns_dropped_total",
            description="Oldest conversation turns dropped so that a response's request fits its limits.",
        )
        zero(self.history_dropped)

    def prefilled_ahead(self, outcome: str, tokens: int) -> None:
        self.ahead.inc(tags={"outcome": outcome})
        if tokens > 0:
            self.ahead_tokens.inc(tokens)

    def barge_in(self, wasted_tokens: int) -> None:
        self.barge_ins.inc()
        if wasted_tokens > 0:
            self.wasted.inc(wasted_tokens)

    def generated(self, tokens: int) -> None:
        if tokens > 0:
            self.generated_tokens.inc(tokens)

    def history_trimmed(self, turns: int) -> None:
        if turns > 0:
            self.history_dropped.inc(turns)
