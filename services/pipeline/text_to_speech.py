"""Text to speech alone (the audio speech endpoints): the talker and vocoder, no thinker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from omni.v1 import common_pb2

from services.common import telemetry
from services.pipeline.checks import TurnChecks
from services.pipeline.events import Event
from services.pipeline.prepared import Prepared, Settlement
from services.pipeline.prompt import PromptBuilder
from services.pipeline.resampler import OUTPUT_RATE
from services.pipeline.speaking import Speaking
from services.pipeline.stage_calls import stage_calls
from services.pipeline.turn import Message, SpeechTurn, Turn
from services.quota.service import Cost, QuotaService
from services.quota.tenants import TenantSpec
from services.router.plan import plan, slo_class


class TextToSpeech:
    def __init__(
        self,
        checks: TurnChecks,
        prompts: PromptBuilder,
        quota: QuotaService,
        settlement: Settlement,
        speaking: Speaking,
    ):
        self.checks, self.prompts, self.quota = checks, prompts, quota
        self.settlement, self.speaking = settlement, speaking

    async def prepare(self, turn: SpeechTurn, tenant: TenantSpec) -> Prepared:
        """Validated and admitted (its text tokens) before any audio is made."""
        voice = self.checks.speech(turn)
        ctx = common_pb2.RequestContext(request_id=f"speech-{uuid.uuid4().hex}", tenant=tenant.id)
        with telemetry.tracer("gateway").start_as_current_span("gateway.prepare_speech"):
            telemetry.inject(ctx)
            # A token talker speaks the thinker's tokens: the text as the assistant's answer to it.
            said = Turn(turn.model, (Message("user", (turn.input,)),))
            layout = self.prompts.layout(said.messages)
            cost = Cost(text_tokens=layout.text_tokens)
            lease = await self.quota.admit(tenant, ctx.request_id, cost, slo_class(tenant))
        p = Prepared(
            said, ctx, plan(True, [], []), [], common_pb2.SamplingParams(), voice, "pcm16", lease, layout
        )
        p.prompt = self.prompts.fill(layout, [])
        p.prompt_tokens = layout.text_tokens
        return p

    async def synthesize(self, p: Prepared) -> AsyncIterator[Event]:
        """The prepared text through the talker and vocoder: pcm16 events at OUTPUT_RATE as they are
        made, then a final event whose usage counts the text and the audio."""
        out: asyncio.Queue = asyncio.Queue()
        seconds = 0.0

        async def speak() -> None:
            try:
                with stage_calls():
                    await self.speaking.speak_text(p, p.turn.messages[0].parts[0], out)
            finally:
                await out.put(None)

        task = asyncio.create_task(speak())
        try:
            while (ev := await out.get()) is not None:
                seconds += len(ev.pcm16) / 2 / OUTPUT_RATE
                yield ev
            task.result()
            usage = common_pb2.Usage(
                prompt_tokens=p.prompt_tokens, total_tokens=p.prompt_tokens, output_audio_seconds=seconds
            )
            yield Event(finish_reason="stop", usage=usage)
        finally:
            task.cancel()
            await self.settlement.release(p.lease, p.lease.cost)
