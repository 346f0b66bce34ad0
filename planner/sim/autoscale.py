"""A stage's replicas scaled on the simulated clock by a real autoscaling policy: Serve's default
(`ray.serve.autoscaling_policy.default_autoscaling_policy`: ongoing requests against
`target_ongoing_requests`) or omniray's SLA policy (services/extensions/ray/sla_autoscaling.py,
reading the simulated gateways' load counters instead of Redis). Every control period (Serve's
0.1 s) the policy gets an `AutoscalingContext` as Serve's controller builds it; as the controller
does, a decision to go up (down) must hold `upscale_delay_s` (`downscale_delay_s`) before replicas
start (are drained); a new replica serves `start_s` after it is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy
from ray.serve._private.common import DeploymentID
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from services.extensions.ray.sla_autoscaling import SlaAutoscaling

CONTROL_PERIOD_S = 0.1  # Serve's controller loop


class SimSla(SlaAutoscaling):
    """The SLA policy reading the simulated gateways' load counters."""

    def __init__(self, counters: Callable[[], dict[str, float]], **params):
        super().__init__(**params)
        self.counters = counters

    def read(self) -> dict[str, float]:
        return dict(self.counters())


class StageScaler:
    def __init__(self, env: simpy.Environment, name: str, policy, config: AutoscalingConfig,
                 replicas: list, start: Callable[[], object], ongoing: Callable[[], float], start_s: float):  # fmt: skip
        self.env, self.name, self.policy, self.config = env, name, policy, config
        self.replicas, self.start, self.ongoing, self.start_s = replicas, start, ongoing, start_s
        self.target = len(replicas)
        self.state: dict = {}
        self._up_since: float | None = None
        self._down_since: float | None = None
        self.history: list[tuple[float, int]] = [(env.now, len(replicas))]
        env.process(self._loop())

    def _context(self) -> AutoscalingContext:
        c = self.config
        return AutoscalingContext(
            deployment_id=DeploymentID(name=self.name, app_name="sim"), deployment_name=self.name, app_name="sim",
            current_num_replicas=len(self.replicas), target_num_replicas=self.target, running_replicas=[],
            total_num_requests=self.ongoing(), total_queued_requests=0.0, aggregated_metrics={}, raw_metrics={},
            capacity_adjusted_min_replicas=c.min_replicas, capacity_adjusted_max_replicas=c.max_replicas,
            policy_state=self.state, last_scale_up_time=None, last_scale_down_time=None,
            current_time=self.env.now, config=c,
        )  # fmt: skip

    def _loop(self):
        c = self.config
        while True:
            yield self.env.timeout(CONTROL_PERIOD_S)
            desired, self.state = self.policy(self._context())
            wanted = min(max(math.ceil(desired - 1e-9), c.min_replicas), c.max_replicas)
            now = self.env.now
            if wanted > self.target:
                self._down_since = None
                self._up_since = now if self._up_since is None else self._up_since
                if now - self._up_since >= c.upscale_delay_s:
                    for _ in range(wanted - self.target):
                        self.env.process(self._add())
                    self.target, self._up_since = wanted, None
            elif wanted < self.target:
                self._up_since = None
                self._down_since = now if self._down_since is None else self._down_since
                if now - self._down_since >= c.downscale_delay_s:
                    for _ in range(self.target - wanted):
                        # out of the routers' list: it finishes what it holds and gets nothing new
                        self.replicas.pop()
                    self.target, self._down_since = wanted, None
                    self.history.append((now, len(self.replicas)))
            else:
                self._up_since = self._down_since = None

    def _add(self):
        yield self.env.timeout(self.start_s)
        self.replicas.append(self.start())
        self.history.append((self.env.now, len(self.replicas)))
