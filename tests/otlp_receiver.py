"""A real OTLP/gRPC trace receiver run by the tests: the deployment exports its spans to it
(OTEL_EXPORTER_OTLP_ENDPOINT) from every replica process, and it keeps them in memory."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict


def _value(v) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.spans: list[ReceivedSpan] = []
        self._cond = threading.Condition()
        self.port = 0

    def Export(self, request, context):
        received = [
            ReceivedSpan(
                s.name,
                s.trace_id.hex(),
                s.span_id.hex(),
                s.parent_span_id.hex(),
                {a.key: _value(a.value) for a in s.attributes},
            )
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]
        with self._cond:
            self.spans.extend(received)
            self._cond.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    @property
    def env(self) -> dict[str, str]:
        """The deployment's environment for exporting here (batches flushed every 200 ms)."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float) -> list[ReceivedSpan]:
        """The spans received so far, once `done(spans)` holds or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not done(self.spans) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return list(self.spans)

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[OtlpReceiver]:
        receiver = cls()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
        receiver.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield receiver
        finally:
            server.stop(grace=None)
