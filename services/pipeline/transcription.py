"""Speech to text (the audio transcription endpoints, a realtime session's input transcription) by
the profile's transcriber."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from omni.v1 import common_pb2, stages_pb2

from services.common import telemetry
from services.dataplane import tensors
from services.extensions.ray.metrics import metric
from services.pipeline.checks import TurnChecks
from services.pipeline.prepared import Settlement
from services.pipeline.stage_calls import StageHandles, stage_calls
from services.pipeline.stage_deadlines import StageDeadlines
from services.pipeline.turn import TranscriptionTurn
from services.quota.service import Cost, Lease, QuotaService
from services.quota.tenants import TenantSpec
from services.router.plan import slo_class


@dataclass
class Transcription:
    turn: TranscriptionTurn
    ctx: common_pb2.RequestContext
    lease: Lease | None  # None: its audio was paid for already
    api: str  # who asked (the transcribed-seconds metric's label)


class Transcribing:
    def __init__(
        self,
        checks: TurnChecks,
        quota: QuotaService,
        settlement: Settlement,
        handles: StageHandles,
        deadlines: StageDeadlines,
    ):
        self.checks, self.quota, self.settlement = checks, quota, settlement
        self.h, self.deadlines = handles, deadlines
        self.transcribed = metric("omniray_gateway_transcribed_audio_seconds_total")

    def check(self, turn: TranscriptionTurn) -> None:
        """What this deployment's transcriber cannot do, as a 400 (before any audio is decoded)."""
        self.checks.transcription(turn)

    async def prepare(
        self, turn: TranscriptionTurn, tenant: TenantSpec, api: str, *, paid: bool = False
    ) -> Transcription:
        """Validated and admitted (the clip's audio seconds), unless its audio is `paid` for already
        (a realtime session's turn)."""
        self.check(turn)
        ctx = common_pb2.RequestContext(request_id=f"transcription-{uuid.uuid4().hex}", tenant=tenant.id)
        telemetry.inject(ctx)
        lease = None
        if not paid:
            cost = Cost(audio_seconds=turn.audio.seconds)
            lease = await self.quota.admit(tenant, ctx.request_id, cost, slo_class(tenant))
        return Transcription(turn, ctx, lease, api)

    async def transcribe(self, t: Transcription) -> AsyncIterator[stages_pb2.TranscribedSegment]:
        """The transcriber's segments as it writes them."""
        try:
            samples = await asyncio.to_thread(t.turn.audio.for_encoder)
            request = stages_pb2.TranscribeRequest(
                ctx=t.ctx,
                audio=stages_pb2.MediaItem(
                    modality="audio",
                    data=tensors.describe(samples, content_hash=t.turn.audio.content_hash),
                    audio_seconds=t.turn.audio.seconds,
                ),
                language=t.turn.language,
                prompt=t.turn.prompt,
                temperature=t.turn.temperature,
            )
            with stage_calls():
                segments = self.h.encoder.options(stream=True).Transcribe.remote(request)
                async for segment in self.deadlines.stream("encoder", segments):
                    yield segment
            self.transcribed.inc(t.turn.audio.seconds, tags={"api": t.api})
        finally:
            if t.lease is not None:
                await self.settlement.release(t.lease, t.lease.cost)
