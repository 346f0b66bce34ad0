"""One place for what every request is observed by: its root span, its tenant (from its key), its
outcome counted under its API, and its response measured (TTFT, TTFP, audio continuity, E2E, RTF)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping

from opentelemetry import trace

from services.common import telemetry
from services.common.errors import OmniError
from services.extensions.ray.metrics import metric
from services.gateway.grpc_wire import Undecodable
from services.gateway.playback import Playback
from services.pipeline.events import Event
from services.quota.service import QuotaService
from services.quota.tenants import TenantSpec


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


class RequestObserver:
    def __init__(self, quota: QuotaService):
        self.quota = quota
        self.requests = metric("omniray_gateway_requests_total")
        self.ttft = metric("omniray_gateway_ttft_seconds")
        self.ttfp = metric("omniray_audio_ttfp_seconds")
        self.e2e = metric("omniray_gateway_e2e_seconds")
        self.rtf = metric("omniray_gateway_audio_rtf_ratio")
        self.audio_sent = metric("omniray_gateway_audio_sent_seconds_total")
        # a stall-free run still shows the series (at 0)
        self.audio_stall = metric("omniray_gateway_audio_stall_seconds_total", api=("rest", "grpc"))

    def counted(self, api_name: str, code: str) -> None:
        self.requests.inc(tags={"api": api_name, "code": code})

    @contextlib.asynccontextmanager
    async def admitting(
        self, api_name: str, op: str, carrier: Mapping[str, str]
    ) -> AsyncIterator[tuple[trace.Span, TenantSpec]]:
        """A request's root span and its tenant (from the key in `carrier`: HTTP headers or gRPC
        metadata); a client error raised in the block (key, body, validation, quota) is counted
        under `api_name` before it leaves."""
        with telemetry.request_span("gateway", op, carrier) as span:
            try:
                yield span, await self.quota.authenticate(bearer_token(carrier.get("authorization")))
            except OmniError as e:
                self.counted(api_name, str(e.status))
                raise

    @contextlib.asynccontextmanager
    async def grpc_admitting(
        self, api_name: str, op: str, request, grpc_context
    ) -> AsyncIterator[tuple[trace.Span, TenantSpec, dict[str, str]]]:
        """`admitting` for a gRPC call: its request decoded (else INVALID_ARGUMENT), its metadata."""
        if isinstance(request, Undecodable):
            raise request.error()
        metadata = dict(grpc_context.invocation_metadata()) if grpc_context else {}
        async with self.admitting(api_name, op, metadata) as (span, tenant):
            yield span, tenant, metadata

    async def events(
        self, api_name: str, events: AsyncIterator[Event], arrival: float, span: trace.Span
    ) -> AsyncIterator[Event]:
        """The response's events, measured; the request's span ends with the stream."""
        first_text = True
        tags = {"api": api_name}
        playback, last_audio = Playback(), arrival
        async with self._ending(api_name, arrival, span):
            try:
                async for ev in events:
                    now = time.perf_counter()
                    if (ev.is_text or ev.text) and first_text:
                        first_text = False
                        self.ttft.observe(now - arrival)
                    if ev.pcm16 and ev.sample_rate:
                        if playback.start is None:
                            self.ttfp.observe(now - arrival)
                        seconds = len(ev.pcm16) / 2 / ev.sample_rate
                        if stall := playback.receive(now, seconds):
                            self.audio_stall.inc(stall, tags=tags)
                        self.audio_sent.inc(seconds, tags=tags)
                        last_audio = now
                    yield ev
            finally:
                span.set_attribute("omniray.audio_seconds", playback.audio_s)
                if playback.audio_s:
                    self.rtf.observe((last_audio - arrival) / playback.audio_s, tags=tags)

    async def items(
        self, api_name: str, items: AsyncIterator, arrival: float, span: trace.Span
    ) -> AsyncIterator:
        """A response's items (a transcription's segments), counted; the span ends with them."""
        async with self._ending(api_name, arrival, span):
            async for item in items:
                yield item

    @contextlib.asynccontextmanager
    async def _ending(self, api_name: str, arrival: float, span: trace.Span) -> AsyncIterator[None]:
        code = "ok"
        try:
            yield
        except BaseException as e:
            code = "error"
            span.record_exception(e)
            span.set_status(trace.StatusCode.ERROR)
            raise
        finally:
            span.end()
            self.counted(api_name, code)
            self.e2e.observe(time.perf_counter() - arrival, tags={"api": api_name})
