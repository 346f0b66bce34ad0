"""Tracing and metrics shared by every stage.

Tracing: one OpenTelemetry trace per request; the W3C context rides in RequestContext.trace_context
so spans of every stage join it. Spans are exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set.
Metrics: declared in services/common/metric_catalog.py, made with Ray's metrics API by
services/extensions/ray/metrics.py (`metric(name)`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping

from omni.v1 import common_pb2
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_setup_lock = threading.Lock()
_configured = False


def _configure() -> None:
    global _configured
    with _setup_lock:
        if _configured:
            return
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):  # else one installed first (a library, a test)
            provider = TracerProvider(resource=Resource.create({"service.name": "omniray"}))
            trace.set_tracer_provider(provider)
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            # OTLP over gRPC; endpoint, headers, TLS and batching from the standard OTEL_* variables.
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _configured = True


def tracer(component: str) -> trace.Tracer:
    _configure()
    return trace.get_tracer(f"omniray.{component}")


def inject(ctx: common_pb2.RequestContext) -> None:
    """Write the current span's context into the message."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    ctx.trace_context.clear()
    ctx.trace_context.update(carrier)


@contextlib.contextmanager
def request_span(component: str, name: str, carrier: Mapping[str, str]) -> Iterator[trace.Span]:
    """A request's root span, current inside the block, joining the caller's trace when `carrier`
    (HTTP headers, gRPC metadata) holds a W3C `traceparent`. It outlives the block: the streamed
    response ends it (span.end()); only a block that raises ends it here."""
    span = tracer(component).start_span(
        name, context=_PROPAGATOR.extract(carrier), kind=trace.SpanKind.SERVER
    )
    try:
        with trace.use_span(span, end_on_exit=False):
            yield span
    except BaseException:
        span.end()
        raise


@contextlib.contextmanager
def stage_span(
    component: str, name: str, ctx: common_pb2.RequestContext, **attributes
) -> Iterator[trace.Span]:
    """A span that continues the trace carried by `ctx`."""
    parent = _PROPAGATOR.extract(dict(ctx.trace_context))
    token = otel_context.attach(parent)
    try:
        with tracer(component).start_as_current_span(name) as span:
            span.set_attribute("omniray.request_id", ctx.request_id)
            span.set_attribute("omniray.tenant", ctx.tenant)
            for key, value in attributes.items():
                span.set_attribute(f"omniray.{key}", value)
            yield span
    finally:
        otel_context.detach(token)
