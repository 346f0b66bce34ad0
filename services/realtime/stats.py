"""Prometheus metrics of realtime sessions (exported through Ray as `ray_omniray_realtime_*`)."""

from __future__ import annotations

from services.extensions.ray.metrics import metric


class RealtimeStats:
    def __init__(self):
        self.sessions = metric("omniray_realtime_sessions")
        self.admission_limit = metric("omniray_realtime_admission_limit")
        self.admitted = metric("omniray_realtime_admitted_total")
        self.generated_tokens = metric("omniray_realtime_generated_tokens_total")
        # exported at 0 until the first one (services/common/metric_catalog.py `at_zero`)
        self.rejected = metric("omniray_realtime_rejected_total")
        self.barge_ins = metric("omniray_realtime_barge_ins_total")
        self.wasted = metric("omniray_realtime_wasted_tokens_total")
        self.ahead = metric("omniray_realtime_prefill_ahead_total", outcome=("done", "failed", "cancelled"))
        self.ahead_tokens = metric("omniray_realtime_prefill_ahead_tokens_total")
        self.history_dropped = metric("omniray_realtime_history_turns_dropped_total")
        self.saves = metric("omniray_realtime_session_saves_total", outcome=("ok", "failed", "taken"))
        self.resumes = metric("omniray_realtime_session_resumes_total", outcome=("ok", "not_found"))
        self.migrations = metric("omniray_realtime_session_migrations_total")

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
