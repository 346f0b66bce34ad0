"""What every stage deployment shares: profile loading, adapter loading, timing and tracing."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from omni.v1 import common_pb2

from services.common.telemetry import stage_span
from services.extensions.ray.metrics import metric
from services.models.profile import ModelSpec, Profile
from services.models.registry import adapter_module

log = logging.getLogger(__name__)


class Stage:
    name = "stage"

    def __init__(self, profile: dict):
        self.profile = Profile.model_validate(profile)
        self.metrics = StageMetrics(self.name)

    def load_model(self, spec: ModelSpec | None):
        """The adapter for `spec`, or None when the profile has none or its programs are missing."""
        if spec is None:
            return None
        if missing := spec.missing():
            log.warning("%s: %s disabled, missing %s", self.name, spec.adapter, ", ".join(missing))
            return None
        return adapter_module(spec.adapter).load(self.profile.model_path(spec), spec.options)

    @contextlib.contextmanager
    def operation(self, op: str, ctx: common_pb2.RequestContext, **attributes) -> Iterator[None]:
        start = time.perf_counter()
        self.metrics.started()
        with stage_span(self.name, f"{self.name}.{op}", ctx, **attributes):
            try:
                yield
            except BaseException:
                self.metrics.error(op)
                raise
            finally:
                self.metrics.finished()
                self.metrics.observe(op, time.perf_counter() - start)


class StageMetrics:
    """Per-stage request latency, errors and in-flight calls, tagged by stage and operation."""

    def __init__(self, stage: str):
        self.stage = stage
        self.latency = metric("omniray_stage_latency_seconds")
        self.inflight = metric("omniray_stage_inflight_requests")
        self._inflight = 0
        self._errors_by_op: dict[str, object] = {}

    def _errors(self, op: str):
        """The error counter; its series for `op` exists (at 0) once the operation has run. Made
        once per operation: a stage call takes no lock for it after that."""
        if (errors := self._errors_by_op.get(op)) is None:
            errors = self._errors_by_op[op] = metric("omniray_stage_errors_total", stage=self.stage, op=op)
        return errors

    def observe(self, op: str, seconds: float) -> None:
        self._errors(op)
        self.latency.observe(seconds, tags={"stage": self.stage, "op": op})

    def error(self, op: str) -> None:
        self._errors(op).inc(tags={"stage": self.stage, "op": op})

    def started(self) -> None:
        self._inflight += 1
        self.inflight.set(self._inflight, tags={"stage": self.stage})

    def finished(self) -> None:
        self._inflight -= 1
        self.inflight.set(self._inflight, tags={"stage": self.stage})
