"""The request pipeline behind every API: it takes a typed Turn (services/pipeline/turn.py), never a
wire format.

prepare(): validate (checks.py), plan, admit against the tenant's quota, decode media, run the
encoder pool (encoding.py) and build the thinker prompt — every client error surfaces here, before
any response byte is sent. generate(): one response (generation.py): prefill -> decode streams text
(thinking.py); with audio out, the talker starts on the first text piece (async chunk) and the
vocoder on the first unit chunk (speaking.py), so PCM streams while the thinker is still writing. A
media item the encoder has seen (a realtime session's earlier turns) is not sent again: its output
is kept on the item. The audio endpoints have their own: text_to_speech.py, transcription.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from omni.v1 import common_pb2, stages_pb2

from services.common import telemetry
from services.common.errors import bad_request
from services.common.session_key import SessionKey
from services.extensions.ray.metrics import metric
from services.models.profile import Profile
from services.pipeline.checks import TurnChecks
from services.pipeline.encoding import MediaEncoding
from services.pipeline.events import Event
from services.pipeline.generation import Generation
from services.pipeline.prepared import Prepared, Settlement
from services.pipeline.prompt import Layout, PromptBuilder, prompt_tokens
from services.pipeline.speaking import Speaking
from services.pipeline.stage_calls import StageHandles
from services.pipeline.stage_deadlines import StageDeadlines
from services.pipeline.text_to_speech import TextToSpeech
from services.pipeline.thinking import Thinking
from services.pipeline.tool_parser import ToolCallParser
from services.pipeline.tools import CallStream, ContentOrCalls, NamedCall, RequiredCalls, Tools
from services.pipeline.transcription import Transcribing
from services.pipeline.turn import AudioClip, ImageInput, Turn, VideoInput
from services.quota.service import Cost, QuotaService
from services.quota.tenants import SLO_CLASSES, TenantSpec
from services.router.plan import plan, slo_class
from services.router.tiles import TileGrid

# Conversations with more text than this are laid out (rendered, tokenized) off the event loop.
INLINE_LAYOUT_CHARS = 16_384


class Pipeline:
    def __init__(
        self,
        profile: Profile,
        handles: StageHandles,
        prompts: PromptBuilder,
        quota: QuotaService,
        *,
        async_chunk: bool | None = None,
    ):
        self.profile, self.prompts, self.quota = profile, prompts, quota
        self.async_chunk = profile.pipeline.async_chunk if async_chunk is None else async_chunk
        self.token_talker = profile.token_talker()
        parser = profile.pipeline.tool_call_parser
        self.tool_parser = (
            ToolCallParser(parser, prompts.tokenizer, profile.served_model_name) if parser else None
        )
        self.tool_calls = metric("omniray_gateway_tool_calls_total", choice=("auto", "required", "function"))
        self.tiles_reduced = metric("omniray_router_tile_policy_reduced_total", slo_class=SLO_CLASSES)
        deadlines = StageDeadlines(profile.pipeline.stage_deadlines)
        self.checks = TurnChecks(profile, prompts, self.tool_parser)
        self.settlement = Settlement(quota)
        self.encoding = MediaEncoding(profile, handles, deadlines)
        self.thinking = Thinking(profile, handles, deadlines)
        self.speaking = Speaking(profile, handles, deadlines, prompts, self.async_chunk)
        self.speech = TextToSpeech(self.checks, prompts, quota, self.settlement, self.speaking)
        self.transcription = Transcribing(self.checks, quota, self.settlement, handles, deadlines)

    def call_stream(self, tools: Tools | None) -> CallStream | None:
        """What splits the answer into content and tool calls (None: all content)."""
        if tools is None or tools.choice == "none":
            return None
        if tools.choice == "function":
            return NamedCall(tools.name)
        if tools.choice == "required":
            return RequiredCalls(tools)
        if self.checks.content_or_calls(tools):
            return ContentOrCalls(tools)
        return self.tool_parser.stream(tools)

    def _layout(self, turn: Turn) -> Layout:
        offered = turn.tools.specs if turn.tools is not None and turn.tools.choice != "none" else ()
        return self.prompts.layout(turn.messages, offered, self.checks.content_or_calls(turn.tools))

    async def prepare(self, turn: Turn, tenant: TenantSpec) -> Prepared:
        """Validate, plan, admit against the tenant's quota; decode and encode media and build the
        prompt (documents: later, in generate(), with progress events)."""
        sampling, voice, audio_format = self.checks.turn(turn)
        await self.checks.schema(turn, sampling)
        slo = slo_class(tenant, turn.slo_class, turn.service_tier)
        ctx = common_pb2.RequestContext(
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            tenant=tenant.id,
            session_id=str(SessionKey(tenant.id, turn.session)) if turn.session else "",
        )
        with telemetry.tracer("gateway").start_as_current_span("gateway.prepare") as span:
            telemetry.inject(ctx)
            max_tiles = self._max_tiles(turn, slo)
            reduced = max_tiles is not None
            grids = self.checks.media(turn, max_tiles)
            with telemetry.tracer("router").start_as_current_span("router.plan"):
                stage_plan = plan(
                    # a required tool call is the whole answer: JSON, never spoken
                    turn.speech is not None and not (turn.tools is not None and turn.tools.forced),
                    [g.tiles for g in grids if g is not None],
                    [m.seconds for m in turn.media if isinstance(m, AudioClip)],
                    [
                        (m.seconds, self.checks.video_frames(m))
                        for m in turn.media
                        if isinstance(m, VideoInput)
                    ],
                    turn.document_pages,
                )
            span.set_attribute("omniray.request_class", stage_plan.request_class)
            span.set_attribute("omniray.tile_policy", "reduced" if reduced else "full")
            span.set_attribute("omniray.slo_class", slo)
            layout = await self._laid_out(turn)
            with telemetry.tracer("quota").start_as_current_span("quota.admit") as qspan:
                cost = Cost(
                    text_tokens=layout.text_tokens + sampling.max_tokens,
                    image_tiles=stage_plan.tiles,
                    audio_seconds=stage_plan.audio_seconds,
                    video_seconds=stage_plan.video_seconds,
                    document_pages=stage_plan.pages,
                    encoder_gflops=stage_plan.tiles * self.profile.tiling.gflops_per_tile,
                )
                lease = await self.quota.admit(tenant, ctx.request_id, cost, slo, realtime=turn.realtime)
                qspan.set_attribute("omniray.queued_s", lease.queued_s)
            p = Prepared(turn, ctx, stage_plan, grids, sampling, voice, audio_format, lease, layout, reduced)
            try:
                # Decoding and encoding come after admission: a request over its quota costs the
                # gateway only header reads.
                if stage_plan.request_class != "document":
                    await self.build_prompt(p)
            except BaseException:
                await self.quota.release(lease)
                raise
        return p

    def _max_tiles(self, turn: Turn, slo: str) -> int | None:
        """The overload tile policy's bound for this request's images, while the encoder pool is
        overloaded (services/router/encoder_load.py; counted), else None."""
        if not any(isinstance(m, ImageInput) for m in turn.media):
            return None
        max_tiles = self.encoding.load.max_tiles(slo)
        if max_tiles is not None:
            self.tiles_reduced.inc(tags={"slo_class": slo})
        return max_tiles

    async def _laid_out(self, turn: Turn) -> Layout:
        if turn.text_chars <= INLINE_LAYOUT_CHARS:
            return self._layout(turn)
        return await asyncio.to_thread(self._layout, turn)

    async def _prompt(
        self,
        ctx: common_pb2.RequestContext,
        turn: Turn,
        layout: Layout,
        grids: list[TileGrid | None],
        progress=None,
        stream_to=None,
    ) -> tuple[stages_pb2.Prompt, list[stages_pb2.EncodedItem]]:
        """The thinker's prompt: the laid-out text with each media item's encoder output in its place
        (a response's, and a turn's speculative prefill). With `stream_to`, images may be in it by
        their placements while they are still encoded (MediaEncoding.encode)."""
        encoded = (
            await self.encoding.encode(ctx, turn.media, grids, progress, stream_to) if turn.media else []
        )
        return self.prompts.fill(layout, encoded), encoded

    async def build_prompt(self, p: Prepared, progress=None) -> None:
        def streaming(task: asyncio.Task) -> None:
            p.encoding = task

        p.prompt, encoded = await self._prompt(p.ctx, p.turn, p.layout, p.grids, progress, streaming)
        p.prompt_tokens = prompt_tokens(p.prompt)
        p.audio_prompt_tokens = sum(
            self.prompts.item_tokens(out)
            for item, out in zip(p.turn.media, encoded, strict=True)
            if isinstance(item, AudioClip)
        )
        if p.prompt_tokens + p.sampling.max_tokens > self.profile.engine.max_model_len:
            raise bad_request(
                f"prompt ({p.prompt_tokens} tokens) plus max_tokens ({p.sampling.max_tokens}) exceeds the "
                f"context length ({self.profile.engine.max_model_len})",
                code="context_length_exceeded",
                param="messages",
            )

    async def prefill_ahead(self, turn: Turn, tenant: TenantSpec) -> int:
        """Speculative prefill of a turn still being spoken (realtime sessions): `turn` holds the
        conversation with the turn's audio so far. Encode it and run it up to the end of its audio —
        the turn's closing template tokens are not known yet — through the session's prefill and
        decode replicas, as the turn itself will run, generating one token: prefill computes the
        KV, decode pulls it into its own cache, so when the whole turn comes both find all but its
        last chunk cached. Returns the prompt tokens (0 when there is no audio to prefill).

        Not debited from the quota: the turn's request pays for the same audio when it comes, and a
        session runs at most one of these at a time, only while its user speaks."""
        sampling, _, _ = self.checks.turn(turn)
        ctx = common_pb2.RequestContext(
            request_id=f"ahead-{uuid.uuid4().hex}",
            tenant=tenant.id,
            session_id=str(SessionKey(tenant.id, turn.session)),
        )
        with telemetry.tracer("gateway").start_as_current_span("gateway.prefill_ahead") as span:
            telemetry.inject(ctx)
            grids = self.checks.media(turn)
            layout = await self._laid_out(turn)
            prompt, _ = await self._prompt(ctx, turn, layout, grids)
            ends = [i for i, seg in enumerate(prompt.segments) if seg.HasField("embeddings")]
            if not ends:
                return 0
            del prompt.segments[ends[-1] + 1 :]
            tokens = prompt_tokens(prompt)
            span.set_attribute("omniray.prompt_tokens", tokens)
            if tokens >= self.profile.engine.max_model_len:
                return 0
            sampling.max_tokens = 1
            async for _ in self.thinking.think(ctx, prompt, tokens, sampling, realtime=turn.realtime):
                pass
        return tokens

    async def generate(self, p: Prepared) -> AsyncIterator[Event]:
        """The prepared request's response, as events (generation.py); made when first iterated, so
        whatever fails fails inside the stream its API observes."""
        async for event in Generation(self, p).events():
            yield event
