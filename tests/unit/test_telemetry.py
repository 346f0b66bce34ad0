"""Trace context rides in RequestContext: a stage's span joins the gateway's trace."""

from omni.v1 import common_pb2
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import telemetry


def test_stage_span_continues_the_request_trace():
    exporter = InMemorySpanExporter()
    telemetry.tracer("test")  # installs the process's provider once
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ctx = common_pb2.RequestContext(request_id="r1", tenant="t1")
    with telemetry.tracer("gateway").start_as_current_span("gateway.prepare") as root:
        telemetry.inject(ctx)
    assert "traceparent" in ctx.trace_context
    # Elsewhere (another process in production): only the message carries the context.
    with telemetry.stage_span("decode", "decode.decode", ctx, chunk_index=3):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    stage = spans["decode.decode"]
    assert stage.context.trace_id == root.get_span_context().trace_id
    assert stage.parent.span_id == root.get_span_context().span_id
    assert stage.attributes["omniray.request_id"] == "r1"
    assert stage.attributes["omniray.chunk_index"] == 3
