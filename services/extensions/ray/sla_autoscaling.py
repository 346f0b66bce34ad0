"""The SLA autoscaling policy: a stage's replicas from the load offered at the gateways, before its
queue grows (Serve's custom autoscaling policy API: `autoscaling_config.policy`, one instance per
deployment, called by Serve's controller every control loop).

Every gateway replica adds what it admits to counters in Redis (`omniray:load`, services/gateway/
load_meter.py): requests, realtime sessions' turns, text tokens, image tiles, audio seconds, and
realtime session-seconds (its rate: the sessions open).
The policy turns the counters into rates over its last `window_s` and a stage needs

    replicas = headroom x sum over kinds of rate(kind) / per_replica[kind]

— `per_replica` being what one replica of the stage serves within the SLOs, from the capacity plan
(`make plan`: planner/plan.py simulates one replica on the hardware profile). An image-heavy mix then
grows the encoder, not decode; a voice-heavy one the talker and vocoder. The result stays within the
deployment's (capacity-adjusted) min and max; with min 0 and no load for `downscale_after_s` it
scales to zero. It goes down only after the lower target has held for `downscale_after_s` (a lull
between bursts keeps the replicas), up at once. Without load counters (Redis unreachable, or not
yet two samples) it grows as Serve's default policy would (queue length) but never shrinks: a
missing signal is not a lull. A failed read is not tried again for `RETRY_S`, so a stalled Redis
costs the controller's loop one short timeout now and then, not one every control period. Serve's controller applies the deployment's `upscale_delay_s` /
`downscale_delay_s` on top of this policy's own decisions.

Profiles switch it on per stage (`stages.<stage>.sla`, services/models/profile.py); without it the
stage runs Serve's default.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from ray.serve.autoscaling_policy import default_autoscaling_policy
from ray.serve.config import AutoscalingContext

from services.common.redis_config import sync_client

log = logging.getLogger("ray.serve")

KEY = "omniray:load"  # hash: kind -> running total (services/gateway/load_meter.py writes it)
KINDS = ("requests", "realtime_requests", "text_tokens", "image_tiles", "audio_seconds", "session_seconds")
READ_TIMEOUT_S = 0.2  # the controller's loop must not wait on Redis
RETRY_S = 5.0  # after a failed read, Serve's default decides this long without trying again


class SlaAutoscaling:
    def __init__(self, per_replica: dict[str, float], headroom: float = 1.2, window_s: float = 20.0,
                 downscale_after_s: float = 60.0, redis_url: str | None = None):  # fmt: skip
        unknown = set(per_replica) - set(KINDS)
        if unknown or not per_replica or any(v <= 0 for v in per_replica.values()):
            raise ValueError(f"per_replica: positive capacities of {KINDS}, not {per_replica}")
        self.per_replica, self.headroom = per_replica, headroom
        self.window_s, self.downscale_after_s = window_s, downscale_after_s
        self.redis = sync_client(redis_url, timeout_s=READ_TIMEOUT_S)
        self._failing = False
        self._retry_at = 0.0

    def read(self) -> dict[str, float] | None:
        if time.monotonic() < self._retry_at:
            return None
        try:
            raw = self.redis.hgetall(KEY)
        except Exception as e:  # unreachable or stalled: Serve's default decides meanwhile
            if not self._failing:
                log.warning("SLA autoscaling: load counters unreadable, deciding by queue length: %s", e)
            self._failing, self._retry_at = True, time.monotonic() + RETRY_S
            return None
        self._failing = False
        return {k.decode() if isinstance(k, bytes) else k: float(v) for k, v in raw.items()}

    def rates(self, samples: list[tuple[float, dict[str, float]]]) -> dict[str, float] | None:
        """Per-second rates between the window's first and last samples."""
        (t0, first), (t1, last) = samples[0], samples[-1]
        if t1 - t0 < 1.0:
            return None
        return {k: max(0.0, last.get(k, 0.0) - first.get(k, 0.0)) / (t1 - t0) for k in self.per_replica}

    def needed(self, rates: dict[str, float]) -> int:
        load = sum(rates[k] / cap for k, cap in self.per_replica.items())
        return math.ceil(self.headroom * load - 1e-9)

    @staticmethod
    def _by_queue(ctx: AutoscalingContext, lo: int, hi: int) -> int:
        """No rates to go by: up as Serve's default would go, never down."""
        target, _ = default_autoscaling_policy(ctx)
        return min(max(math.ceil(target), ctx.target_num_replicas, lo), hi)

    def __call__(self, ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
        now = time.time() if ctx.current_time is None else ctx.current_time
        state = dict(ctx.policy_state or {})
        lo, hi = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
        counters = self.read()
        if counters is None:
            return self._by_queue(ctx, lo, hi), state
        samples = [s for s in state.get("sla_samples", []) if now - s[0] <= self.window_s] + [(now, counters)]
        state["sla_samples"] = samples
        rates = self.rates(samples)
        if rates is None:
            return self._by_queue(ctx, lo, hi), state
        target = min(max(self.needed(rates), lo), hi)
        current = ctx.target_num_replicas
        if target < current:
            since = state.setdefault("sla_lower_since", now)
            if now - since < self.downscale_after_s:
                target = current  # a lull: keep them until the lower target has held
        else:
            state.pop("sla_lower_since", None)
        state["sla_rates"] = rates
        return target, state
