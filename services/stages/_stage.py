"""What every stage deployment shares: profile loading, adapter loading, timing and tracing."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from omni.v1 import common_pb2

from services.common.telemetry import StageMetrics, stage_span
from services.models.profile import ModelSpec, Profile, load_profile
from services.models.registry import adapter_module

log = logging.getLogger(__name__)


class Stage:
    name = "stage"

    def __init__(self, profile: str):
        self.profile: Profile = load_profile(profile)
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
