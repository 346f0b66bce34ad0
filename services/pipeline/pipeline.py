"""The request pipeline behind every API: it takes a typed Turn (services/pipeline/turn.py), never a
wire format.

prepare(): validate, plan, admit against the tenant's quota, decode media, run the encoder pool and
build the thinker prompt (every client error surfaces here, before any response byte is sent).
generate(): prefill -> decode streams text; with audio out, the talker starts on the first text piece
(async chunk) and the vocoder on the first unit chunk, so PCM streams while the thinker is still
writing. A media item the encoder has seen (a realtime session's earlier turns) is not sent again:
its output is kept on the item.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import numpy as np
from omni.v1 import common_pb2, stages_pb2
from ray.exceptions import ActorUnavailableError, GetTimeoutError, ObjectLostError, RayActorError
from ray.serve.exceptions import DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from services.common import telemetry
from services.common.errors import OmniError, bad_request, too_large
from services.common.redis_config import async_client
from services.common.session_key import SessionKey
from services.common.streams import next_batch
from services.dataplane import tensors, token_stream
from services.extensions.ray.metrics import metric
from services.models.profile import Profile
from services.models.versions import FeatureVersionMismatch, FeatureVersions
from services.pipeline.prompt import Layout, PromptBuilder, expanded_ids, prompt_tokens
from services.pipeline.resampler import OUTPUT_RATE, StreamResampler
from services.pipeline.stage_deadlines import StageDeadlines, StageStalled
from services.pipeline.structured_output import checked_json_schema
from services.pipeline.text_chunker import TextChunker
from services.pipeline.tool_parser import ToolCallParser
from services.pipeline.tools import CallDelta, CallStream, ContentOrCalls, NamedCall, RequiredCalls, Tools
from services.pipeline.turn import (
    SEED_BOUND,
    SPEECH_FORMATS,
    AudioClip,
    ImageInput,
    Message,
    SpeechTurn,
    TranscriptionTurn,
    Turn,
)
from services.pipeline.vocoder_window import VocodeCall, VocoderWindow
from services.quota.service import Cost, Lease, QuotaService
from services.quota.tenants import TenantSpec
from services.router.plan import StagePlan, plan, slo_class
from services.router.tiles import TILE_POLICY_VERSION, TileGrid, tile_grid

log = logging.getLogger("ray.serve")
# Without async chunk, whole-utterance audio is still sent to the client in pieces of this length.
WHOLE_AUDIO_PIECE_S = 0.5
# Conversations with more text than this are laid out (rendered, tokenized) off the event loop.
INLINE_LAYOUT_CHARS = 16_384
# A stage replica's process died or is unreachable (a handle call raises one of these), its call
# went past its deadline (alive but not answering), or the object a stage left in the object store
# is gone with it or cannot be fetched in time.
STAGE_GONE = (
    RayActorError,
    ActorUnavailableError,
    DeploymentUnavailableError,
    ObjectLostError,
    GetTimeoutError,
    StageStalled,
)


class DecodeDropped(Exception):
    """A decode stream that ended with no finish reason: its engine gave the request up
    (vLLM's `error` or `abort`: services/engine/session_kv.py GAVE_UP) without answering it."""


@dataclass
class Event:
    text: str = ""
    tokens: int = 0  # generated tokens behind `text` (their text may be empty)
    pcm16: bytes = b""
    sample_rate: int = 0
    transcript: str | None = None
    finish_reason: str | None = None
    usage: common_pb2.Usage | None = None
    progress: common_pb2.Progress | None = None
    calls: tuple[CallDelta, ...] = ()  # tool calls as they are written (`text` is the content)
    frame_ms: float = 0.0  # the decode engine's frame time as of this text (0: not measured)

    @property
    def is_text(self) -> bool:
        """Only generated text (what piles up and merges under load)."""
        return bool(self.tokens or self.text) and not (
            self.pcm16 or self.finish_reason is not None or self.progress is not None or self.calls
        )


def _merge_text(batch: list[Event | None]) -> list[Event | None]:
    """Consecutive text events that piled up become one (fewer chunks on the wire under load)."""
    merged: list[Event | None] = []
    for ev in batch:
        prev = merged[-1] if merged else None
        if ev is not None and prev is not None and ev.is_text and prev.is_text:
            merged[-1] = Event(text=prev.text + ev.text, tokens=prev.tokens + ev.tokens, frame_ms=ev.frame_ms)
        else:
            merged.append(ev)
    return merged


# name: (low, high) — OpenAI's ranges.
SAMPLING_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
MAX_STOP, MAX_STOP_CHARS = 4, 256
MAX_SESSION_CHARS = 128


@contextlib.contextmanager
def stage_calls() -> Iterator[None]:
    """A stage replica that died or cannot be reached, or a decode its engine dropped, is a 503 (gRPC
    UNAVAILABLE): the request may be retried once Serve replaces it. Logged under an id; the client
    gets only the id."""
    try:
        yield
    except (*STAGE_GONE, DecodeDropped) as e:
        error_id = f"err_{uuid.uuid4().hex[:16]}"
        log.error("a stage call failed [%s]", error_id, exc_info=e)
        raise OmniError(
            503,
            f"a model stage is unavailable; retry shortly (error id {error_id})",
            code="stage_unavailable",
            headers={"retry-after": "1"},
        ) from None


RESUME_CAUSES = ("replica_lost", "replica_stalled", "engine_dropped")


def _cause(lost: Exception) -> str:
    """Why a decode was lost (RESUME_CAUSES)."""
    if isinstance(lost, DecodeDropped):
        return "engine_dropped"
    return "replica_stalled" if isinstance(lost, StageStalled) else "replica_lost"


def _continued(request: stages_pb2.DecodeRequest, sent: list[int], attempt: int) -> stages_pb2.DecodeRequest:
    """The request again as its `attempt`-th resumed decode, its prompt followed by the tokens
    already sent, for what is left of max_tokens; decode computes the prompt itself (the prefill
    replica's hand-off was for the lost one)."""
    continued = stages_pb2.DecodeRequest()
    continued.CopyFrom(request)
    continued.kv_transfer_params = ""
    continued.attempt = attempt
    if sent:
        continued.prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=sent))
        continued.sampling.max_tokens = request.sampling.max_tokens - len(sent)
        continued.answered_tokens = len(sent)
    return continued


@dataclass
class Prepared:
    turn: Turn
    ctx: common_pb2.RequestContext
    plan: StagePlan
    grids: list[TileGrid | None]  # per media item: the image's tile grid (None for audio)
    sampling: common_pb2.SamplingParams
    voice: str
    audio_format: str
    lease: Lease
    layout: Layout
    # Built in prepare(), except for documents: their encoding runs inside generate() so that
    # progress events stream to the client while the tiles are encoded.
    prompt: stages_pb2.Prompt | None = None
    prompt_tokens: int = 0
    # The response's speech to OUTPUT_RATE (made at its first audio: the vocoder says its rate).
    resampler: StreamResampler | None = None
    audio_prompt_tokens: int = 0  # of prompt_tokens: the request's audio (usage details)


@dataclass
class StageHandles:
    encoder: DeploymentHandle
    prefill: DeploymentHandle
    decode: DeploymentHandle
    talker: DeploymentHandle
    vocoder: DeploymentHandle


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
        self.profile = profile
        self.h = handles  # calls go over Serve's gRPC transport (SERVE_ENV: throughput-optimized mode)
        self.prompts = prompts
        self.quota = quota
        self.feature_versions = {
            m: FeatureVersions.for_profile(profile, m).encode() for m in ("image", "audio")
        }
        self.version_mismatches = metric(
            "omniray_encoder_feature_version_mismatch_total", modality=tuple(self.feature_versions)
        )
        self.async_chunk = profile.pipeline.async_chunk if async_chunk is None else async_chunk
        self.token_talker = profile.token_talker()
        self._releasing: set[asyncio.Task] = set()  # quota releases that outlive their request
        self.transcribed = metric("omniray_gateway_transcribed_audio_seconds_total")
        self.tool_calls = metric("omniray_gateway_tool_calls_total", choice=("auto", "required", "function"))
        self.deadlines = StageDeadlines(profile.pipeline.stage_deadlines)
        self.decode_resumes = metric(
            "omniray_gateway_decode_resumes_total", outcome=("resumed", "failed"), cause=RESUME_CAUSES
        )
        self.resume_seconds = metric("omniray_gateway_decode_resume_seconds")
        self._token_redis = None  # speech on a token talker: the token streams it writes (made on use)
        parser = profile.pipeline.tool_call_parser
        self.tool_parser = (
            ToolCallParser(parser, prompts.tokenizer, profile.served_model_name) if parser else None
        )

    # ---- validation and preparation -----------------------------------------------------

    def _validate(self, turn: Turn) -> tuple[common_pb2.SamplingParams, str, str]:
        limits, pipe = self.profile.limits, self.profile.pipeline
        self._check_model(turn.model)
        if not turn.messages:
            raise bad_request("messages must not be empty", param="messages")
        if len(turn.messages) > limits.max_messages:
            raise bad_request(f"at most {limits.max_messages} messages", param="messages")
        if len(turn.session) > MAX_SESSION_CHARS:
            raise bad_request(
                f"session id must be at most {MAX_SESSION_CHARS} characters", param="x-omniray-session-id"
            )
        voice, audio_format = "", "pcm16"
        if turn.speech is not None:
            if why := self.profile.speech_out_unavailable():
                raise bad_request(
                    f"{why}; use modalities ['text']", code="unsupported_modality", param="modalities"
                )
            voice = self._voice_named(turn.speech.voice, "audio.voice")
            audio_format = turn.speech.format
            if audio_format not in SPEECH_FORMATS:
                raise bad_request(f"audio.format must be one of {SPEECH_FORMATS}", param="audio.format")
        s = turn.sampling
        max_tokens = pipe.default_max_tokens if s.max_tokens is None else s.max_tokens
        if max_tokens < 1:
            raise bad_request("max_tokens must be positive", param="max_tokens")
        if max_tokens > limits.max_tokens_cap:
            raise bad_request(f"max_tokens must be at most {limits.max_tokens_cap}", param="max_tokens")
        self._check_text_fits(turn, max_tokens)
        for name, (low, high) in SAMPLING_RANGES.items():
            value = getattr(s, name)
            if not (math.isfinite(value) and low <= value <= high):
                raise bad_request(f"{name} must be a number in [{low:g}, {high:g}]", param=name)
        if len(s.stop) > MAX_STOP or not all(0 < len(x) <= MAX_STOP_CHARS for x in s.stop):
            raise bad_request(
                f"stop takes at most {MAX_STOP} non-empty sequences of at most {MAX_STOP_CHARS} characters",
                param="stop",
            )
        if s.seed is not None and not -SEED_BOUND <= s.seed < SEED_BOUND:
            raise bad_request("seed must be a 64-bit integer", param="seed")
        json_schema = s.json_schema or ""
        if (tools := turn.tools) is not None:
            json_schema = self.tool_schema(tools, s.json_schema is not None or s.json_object)
        sampling = common_pb2.SamplingParams(
            max_tokens=max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed or 0,
            stop=list(s.stop),
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            json_schema=json_schema,
            json_object=s.json_object,
        )
        return sampling, voice, audio_format

    def _check_text_fits(self, turn: Turn, max_tokens: int) -> None:
        """Text that cannot fit the context even at the most characters a token holds is a 400 before
        anything is tokenized; the exact check, in tokens, follows the layout (_build_prompt)."""
        context = self.profile.engine.max_model_len
        if turn.text_chars > (context - max_tokens) * self.prompts.max_token_chars:
            raise bad_request(
                f"the messages' text ({turn.text_chars} characters) plus max_tokens ({max_tokens}) "
                f"cannot fit the context length ({context} tokens)",
                code="context_length_exceeded",
                param="messages",
            )

    def tool_schema(self, tools: Tools, structured: bool = False) -> str:
        """The schema a forced call is generated under ("" when the model answers freely); what
        this deployment cannot do with `tools` is a 400."""
        tools.check()
        if self._content_or_calls(tools):
            if structured:
                raise bad_request(
                    f"response_format cannot be combined with tool_choice 'auto' on profile "
                    f"{self.profile.name!r}: its model has no tool-call format, so 'auto' is itself "
                    "answered as structured output (docs/api.md, Tools)",
                    param="response_format",
                )
            return tools.content_or_calls_schema()
        if not tools.forced:
            return ""
        if structured:
            raise bad_request(
                "response_format cannot be combined with a required tool call", param="response_format"
            )
        return tools.schema()

    @staticmethod
    async def check_schema(turn: Turn, sampling: common_pb2.SamplingParams) -> None:
        """The schema the answer is generated under compiles (a required call's, or
        response_format's): a 400 with the reason otherwise."""
        if sampling.json_schema:
            forced = turn.tools is not None and turn.tools.forced
            where = {"param": "tools", "what": "tools"} if forced else {}
            await checked_json_schema(sampling.json_schema, **where)

    def _check_media(self, turn: Turn) -> list[TileGrid | None]:
        """What the media cost and whether this deployment takes them, from their headers alone:
        what the plan and the quota need, before anything is decoded. Returns each image's tile
        grid (None for audio)."""
        limits = self.profile.limits
        if len(turn.media) > limits.max_media_items:
            raise bad_request(
                f"at most {limits.max_media_items} images and audio clips per request",
                code="too_many_media_items",
                param="messages",
            )
        grids: list[TileGrid | None] = []
        decoded = 0
        for item in turn.media:
            kind = "image" if isinstance(item, ImageInput) else "audio"
            if getattr(self.profile.models, "vision" if kind == "image" else "audio") is None:
                raise bad_request(
                    f"profile {self.profile.name!r} does not accept {kind} input",
                    code="unsupported_modality",
                    param="messages",
                )
            grid = None
            if isinstance(item, ImageInput):
                t = self.profile.tiling
                grid = tile_grid(item.width, item.height, item.detail, t.tile_px, t.max_tiles)
            decoded += item.decoded_bytes
            if decoded > limits.max_media_decoded_bytes:
                raise too_large(
                    f"the request's media decode to more than {limits.max_media_decoded_bytes} bytes",
                    code="media_too_large",
                    param="messages",
                )
            grids.append(grid)
        return grids

    def _content_or_calls(self, tools: Tools | None) -> bool:
        """ "auto" on a model with no call format of its own (no tool parser): the answer is
        generated as `{"content": ...}` or `{"tool_calls": [...]}`."""
        return tools is not None and tools.choice == "auto" and self.tool_parser is None

    def _call_stream(self, tools: Tools | None) -> CallStream | None:
        """What splits the answer into content and tool calls (None: all content)."""
        if tools is None or tools.choice == "none":
            return None
        if tools.choice == "function":
            return NamedCall(tools.name)
        if tools.choice == "required":
            return RequiredCalls(tools)
        if self._content_or_calls(tools):
            return ContentOrCalls(tools)
        return self.tool_parser.stream(tools)

    def _layout(self, turn: Turn) -> Layout:
        offered = turn.tools.specs if turn.tools is not None and turn.tools.choice != "none" else ()
        return self.prompts.layout(turn.messages, offered, self._content_or_calls(turn.tools))

    async def prepare(self, turn: Turn, tenant: TenantSpec) -> Prepared:
        """Validate, plan, admit against the tenant's quota; decode and encode media and build the
        prompt (documents: later, in generate(), with progress events)."""
        sampling, voice, audio_format = self._validate(turn)
        await self.check_schema(turn, sampling)
        slo = slo_class(tenant, turn.slo_class, turn.service_tier)
        ctx = common_pb2.RequestContext(
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            tenant=tenant.id,
            session_id=str(SessionKey(tenant.id, turn.session)) if turn.session else "",
        )
        with telemetry.tracer("gateway").start_as_current_span("gateway.prepare") as span:
            telemetry.inject(ctx)
            grids = self._check_media(turn)
            with telemetry.tracer("router").start_as_current_span("router.plan"):
                stage_plan = plan(
                    # a required tool call is the whole answer: JSON, never spoken
                    turn.speech is not None and not (turn.tools is not None and turn.tools.forced),
                    [g.tiles for g in grids if g is not None],
                    [m.seconds for m in turn.media if isinstance(m, AudioClip)],
                )
            span.set_attribute("omniray.request_class", stage_plan.request_class)
            span.set_attribute("omniray.slo_class", slo)
            layout = await self._laid_out(turn)
            with telemetry.tracer("quota").start_as_current_span("quota.admit") as qspan:
                cost = Cost(
                    text_tokens=layout.text_tokens + sampling.max_tokens,
                    image_tiles=stage_plan.tiles,
                    audio_seconds=stage_plan.audio_seconds,
                    document_pages=stage_plan.pages,
                    encoder_gflops=stage_plan.tiles * self.profile.tiling.gflops_per_tile,
                )
                lease = await self.quota.admit(tenant, ctx.request_id, cost, slo)
                qspan.set_attribute("omniray.queued_s", lease.queued_s)
            p = Prepared(turn, ctx, stage_plan, grids, sampling, voice, audio_format, lease, layout)
            try:
                # Decoding and encoding come after admission: a request over its quota costs the
                # gateway only header reads.
                if stage_plan.request_class != "document":
                    await self._build_prompt(p)
            except BaseException:
                await self.quota.release(lease)
                raise
        return p

    async def _laid_out(self, turn: Turn) -> Layout:
        if turn.text_chars <= INLINE_LAYOUT_CHARS:
            return self._layout(turn)
        return await asyncio.to_thread(self._layout, turn)

    async def _build_prompt(self, p: Prepared, progress=None) -> None:
        encoded = await self._encode(p.ctx, p.turn.media, p.grids, progress) if p.turn.media else []
        p.prompt = self.prompts.fill(p.layout, encoded)
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

    # ---- the encoder ---------------------------------------------------------------------

    def _version(self, item: AudioClip | ImageInput) -> str:
        return self.feature_versions["image" if isinstance(item, ImageInput) else "audio"]

    @staticmethod
    def _media_item(item: AudioClip | ImageInput, grid: TileGrid | None) -> stages_pb2.MediaItem:
        """The stage contract's item: decoded samples (at the encoders' rate) or pixels."""
        if isinstance(item, AudioClip):
            return stages_pb2.MediaItem(
                modality="audio",
                data=tensors.describe(item.for_encoder(), content_hash=item.content_hash),
                audio_seconds=item.seconds,
            )
        return stages_pb2.MediaItem(
            modality="image",
            detail=item.detail,
            tiles=stages_pb2.TileGrid(
                cols=grid.cols, rows=grid.rows, tile_px=grid.tile_px, policy_version=TILE_POLICY_VERSION
            ),
            data=tensors.describe(item.pixels(), content_hash=item.content_hash),
        )

    async def _encode(
        self,
        ctx: common_pb2.RequestContext,
        items: list[AudioClip | ImageInput],
        grids: list[TileGrid | None],
        progress=None,
    ) -> list[stages_pb2.EncodedItem]:
        """Each item's encoder output at this deployment's versions: kept on the item from an earlier
        request, or encoded now (new items only; their outputs are then kept on them). A mismatch (an
        encoder replica still on the previous version during a rollout) is counted and re-encoded
        once. With `progress`, the encoder streams progress events to it while it works."""
        new = [i for i, item in enumerate(items) if self._version(item) not in item.encoded]
        if new:
            request = await asyncio.to_thread(
                lambda: stages_pb2.EncodeRequest(
                    ctx=ctx, items=[self._media_item(items[i], grids[i]) for i in new]
                )
            )
            encoded = await self._encode_items(request, progress)
            stale = self._stale(request.items, encoded)
            if stale:
                for modality in stale:
                    self.version_mismatches.inc(tags={"modality": modality})
                request.bypass_cache = True
                request.require_versions.update({m: self.feature_versions[m] for m in stale})
                try:
                    encoded = await self._encode_items(request)
                except Exception as e:  # the replica cannot serve the version (raised in another process)
                    if FeatureVersionMismatch.CODE not in str(e):
                        raise
                    encoded = None
                if encoded is None or self._stale(request.items, encoded):
                    raise OmniError(
                        503,
                        "encoder replicas serve other model versions than this gateway; retry shortly",
                        code=FeatureVersionMismatch.CODE,
                    )
            for i, out in zip(new, encoded, strict=True):
                if items[i].keep:
                    out = await _owned(out, items[i])
                items[i].encoded[out.encoder_version] = out
        return [item.encoded[self._version(item)] for item in items]

    async def _encode_items(self, request: stages_pb2.EncodeRequest, progress=None) -> list:
        with stage_calls():
            if progress is None:
                reply = await self.deadlines.reply("encoder", self.h.encoder.Encode.remote(request))
                return list(reply.items)
            encoded: list = []
            events = self.h.encoder.options(stream=True).EncodeStream.remote(request)
            async for event in self.deadlines.stream("encoder", events):
                if event.HasField("progress"):
                    await progress(event.progress)
                else:
                    encoded = list(event.result.items)
            return encoded

    def _stale(self, items, encoded: list[stages_pb2.EncodedItem]) -> list[str]:
        return [
            item.modality
            for item, out in zip(items, encoded, strict=True)
            if out.encoder_version != self.feature_versions[item.modality]
        ]

    async def prefill_ahead(self, turn: Turn, tenant: TenantSpec) -> int:
        """Speculative prefill of a turn still being spoken (realtime sessions): `turn` holds the
        conversation with the turn's audio so far. Encode it and run it up to the end of its audio —
        the turn's closing template tokens are not known yet — through the session's prefill and
        decode replicas, as the turn itself will run, generating one token: prefill computes the
        KV, decode pulls it into its own cache, so when the whole turn comes both find all but its
        last chunk cached. Returns the prompt tokens (0 when there is no audio to prefill).

        Not debited from the quota: the turn's request pays for the same audio when it comes, and a
        session runs at most one of these at a time, only while its user speaks."""
        sampling, _, _ = self._validate(turn)
        ctx = common_pb2.RequestContext(
            request_id=f"ahead-{uuid.uuid4().hex}",
            tenant=tenant.id,
            session_id=str(SessionKey(tenant.id, turn.session)),
        )
        with telemetry.tracer("gateway").start_as_current_span("gateway.prefill_ahead") as span:
            telemetry.inject(ctx)
            grids = self._check_media(turn)
            layout = await self._laid_out(turn)
            prompt = self.prompts.fill(layout, await self._encode(ctx, turn.media, grids))
            ends = [i for i, seg in enumerate(prompt.segments) if seg.HasField("embeddings")]
            if not ends:
                return 0
            del prompt.segments[ends[-1] + 1 :]
            tokens = prompt_tokens(prompt)
            span.set_attribute("omniray.prompt_tokens", tokens)
            if tokens >= self.profile.engine.max_model_len:
                return 0
            sampling.max_tokens = 1
            async for _ in self._think(ctx, prompt, tokens, sampling):
                pass
        return tokens

    async def _think(
        self,
        ctx: common_pb2.RequestContext,
        prompt: stages_pb2.Prompt,
        tokens: int,
        sampling: common_pb2.SamplingParams,
        token_stream: str = "",
    ) -> AsyncIterator[stages_pb2.DecodeChunk]:
        """The thinker: prefill (for prompts long enough to pay for the hand-off) then decode,
        streamed. Turns of one session go to the replicas that served it before (session_affinity).
        With `token_stream`, decode also writes the tokens there for a token talker."""
        kv_params = ""
        session = {"session_id": ctx.session_id} if ctx.session_id else {}
        with stage_calls():
            if (
                self.profile.engine.kv_transfer != "none"
                and tokens >= self.profile.engine.disagg_min_prompt_tokens
            ):
                pre = await self.deadlines.reply(
                    "prefill",
                    self.h.prefill.options(**session).Prefill.remote(
                        stages_pb2.PrefillRequest(ctx=ctx, prompt=prompt, sampling=sampling)
                    ),
                )
                kv_params = pre.kv_transfer_params
            request = stages_pb2.DecodeRequest(
                ctx=ctx,
                prompt=prompt,
                sampling=sampling,
                kv_transfer_params=kv_params,
                token_stream=token_stream,
            )
            async for chunk in self._decode(request, session):
                yield chunk

    async def _decode(
        self, request: stages_pb2.DecodeRequest, session: dict
    ) -> AsyncIterator[stages_pb2.DecodeChunk]:
        """Decode, streamed. When the replica serving it dies mid-response, stalls past its deadline
        (StageStalled), or its engine drops the request (DecodeDropped), the response goes on on
        another (or the replaced, or the same) replica from the tokens already sent: the prompt and
        those tokens are computed again (prefix caching and the KV store hold the prompt's pages)
        and generation continues for what is left of max_tokens — one visible hiccup, counted, and
        bounded by `pipeline.decode_resume.wait_s`. Not for answers under a grammar (structured
        output would restart its state mid-answer): those fail as before."""
        resume = self.profile.pipeline.decode_resume
        original, sent, resent = request, [], 0
        lost_at: float | None = None  # when the decode was lost (None: serving)
        cause = ""  # why: replica_lost, engine_dropped
        while True:
            try:
                finished = False
                chunks = self.h.decode.options(stream=True, **session).Decode.remote(request)
                async for chunk in self.deadlines.stream("decode", chunks):
                    if lost_at is not None and (chunk.token_ids or chunk.finish_reason):
                        self.decode_resumes.inc(tags={"outcome": "resumed", "cause": cause})
                        self.resume_seconds.observe(time.monotonic() - lost_at)
                        lost_at = None
                    sent.extend(chunk.token_ids)
                    if resent and chunk.usage.total_tokens:
                        # the engine counted the resent tokens as prompt: they were generated
                        chunk.usage.prompt_tokens -= resent
                        chunk.usage.completion_tokens += resent
                    finished = bool(chunk.finish_reason)
                    yield chunk
                if not finished:
                    raise DecodeDropped()
                return
            except (*STAGE_GONE, DecodeDropped) as e:
                if finished:  # lost after the answer's last chunk: nothing to resume
                    return
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    cause = _cause(e)
                left = original.sampling.max_tokens - len(sent)
                grammar = original.sampling.json_schema or original.sampling.json_object
                if not resume.enabled or grammar or left <= 0 or now - lost_at > resume.wait_s:
                    if resume.enabled and not grammar:
                        self.decode_resumes.inc(tags={"outcome": "failed", "cause": cause})
                    raise
                log.warning(
                    "decode lost mid-response (%s, %s): resuming after %d tokens",
                    original.ctx.request_id,
                    cause,
                    len(sent),
                )
                request, resent = _continued(original, sent, request.attempt + 1), len(sent)
                await asyncio.sleep(resume.retry_s)

    # ---- generation ----------------------------------------------------------------------

    async def generate(self, p: Prepared) -> AsyncIterator[Event]:
        out: asyncio.Queue = asyncio.Queue()
        pieces: asyncio.Queue = asyncio.Queue()
        final: dict = {}
        tokens_to = token_stream.key(p.ctx.request_id) if p.plan.speak and self.token_talker else ""
        written: list[str] = []  # the answer's content as written (a token talker's transcript)
        thought = asyncio.Event()
        calls_in = self._call_stream(p.turn.tools)
        calling = asyncio.Event()  # a tool call began
        # A token talker stops at the call's marker token (tool_parser.call_start_ids) where the
        # model wrote one: it says the lead-in whole rather than being cut when the call is parsed.
        parsed = p.turn.tools is not None and p.turn.tools.choice == "auto" and self.tool_parser is not None
        stops = frozenset(self.tool_parser.call_start_ids if tokens_to and parsed else ())
        marked = asyncio.Event()  # the talker has the marker the call began with

        async def think() -> None:
            try:
                if p.prompt is None:  # a document: encode now, streaming progress
                    await self._build_prompt(p, progress=lambda pr: out.put(Event(progress=pr)))
                await generate_text()
            finally:
                thought.set()
                await pieces.put(None)  # speak() ends even when thinking failed

        async def generate_text() -> None:
            chunker = TextChunker(
                self.profile.pipeline.chunk_min_tokens, self.profile.pipeline.chunk_max_tokens
            )
            text = []
            called: set[int] = set()  # the calls written

            async def wrote(content: str, calls: list[CallDelta], tokens: int, frame_ms: float = 0.0) -> None:
                # Tokens whose text is empty go out too (as vLLM's server sends them) — but not
                # while calls are being written: their tokens go with the next piece (or the end).
                tokens += final.pop("unsent", 0)
                if content or calls or (tokens and calls_in is None):
                    await out.put(Event(text=content, tokens=tokens, calls=tuple(calls), frame_ms=frame_ms))
                elif tokens:
                    final["unsent"] = tokens
                called.update(d.index for d in calls if d.id)
                if calls and tokens_to and not calling.is_set():
                    calling.set()  # a token talker would speak the call's tokens: it stops here
                if content:
                    text.append(content)
                    written.append(content)
                    if (
                        p.plan.speak
                        and not tokens_to
                        and self.async_chunk
                        and (piece := chunker.push(content, tokens))
                    ):
                        await pieces.put(piece)

            async for chunk in self._think(p.ctx, p.prompt, p.prompt_tokens, p.sampling, tokens_to):
                final["generated"] = final.get("generated", 0) + len(chunk.token_ids)
                if stops and not stops.isdisjoint(chunk.token_ids):
                    marked.set()
                content, calls = calls_in.feed(chunk.text) if calls_in else (chunk.text, [])
                await wrote(content, calls, len(chunk.token_ids), chunk.frame_ms)
                if chunk.finish_reason:
                    final.update(finish_reason=chunk.finish_reason, usage=chunk.usage)
            if calls_in is not None:
                await wrote(*calls_in.finish(), 0)
                if calls_in.made and final.get("finish_reason", "stop") == "stop":
                    final["finish_reason"] = "tool_calls"
                if called:
                    self.tool_calls.inc(len(called), tags={"choice": p.turn.tools.choice})
            if p.plan.speak and not tokens_to:
                rest = chunker.flush() if self.async_chunk else "".join(text)
                if rest and rest.strip():
                    await pieces.put(rest)

        async def speak() -> None:
            index = 0
            while (piece := await pieces.get()) is not None:
                talk = stages_pb2.TalkRequest(ctx=p.ctx, text=piece, voice=p.voice, chunk_index=index)
                index += 1
                # the piece goes with its first audio
                if await self._voice(p, talk, out, functools.partial(next, iter([piece]), None)):
                    final["speech_cut"] = True
            await self._end_speech(p, out)

        async def speak_tokens() -> None:
            """A token talker: one call for the whole response, reading the thinker's tokens as
            decode writes them (async chunk) or, without async chunk, once the thinker is done."""
            if not self.async_chunk:
                await thought.wait()
            ids, placements = expanded_ids(p.prompt)
            talk = stages_pb2.TalkRequest(
                ctx=p.ctx,
                voice=p.voice,
                thinker=stages_pb2.ThinkerOutput(
                    prompt_ids=ids, media=placements, token_stream=tokens_to, stop_token_ids=sorted(stops)
                ),
                seed=p.sampling.seed,
            )
            spoken = 0

            def transcript() -> str | None:  # the text written since the last audio went out
                nonlocal spoken
                new, spoken = "".join(written[spoken:]), len(written)
                return new or None

            voice = asyncio.create_task(self._voice(p, talk, out, transcript))
            called = asyncio.create_task(calling.wait())
            lead_in = False  # a call came after content, at a marker the talker stops at
            try:
                await asyncio.wait((voice, called), return_when=asyncio.FIRST_COMPLETED)
                lead_in = calling.is_set() and marked.is_set() and "".join(written).strip() != ""
                if lead_in:
                    await asyncio.wait((voice,))
            finally:
                called.cancel()
                if not voice.done():
                    voice.cancel()
                    await asyncio.gather(voice, return_exceptions=True)
            if lead_in or not calling.is_set():
                final["speech_cut"] = voice.result()
            await self._end_speech(p, out)

        async def run(coro) -> None:
            try:
                with stage_calls():
                    await coro
            finally:
                await out.put(None)

        tasks = [asyncio.create_task(run(think()))]
        if p.plan.speak:
            tasks.append(asyncio.create_task(run(speak_tokens() if tokens_to else speak())))
        try:
            done = 0
            while done < len(tasks):
                for ev in _merge_text(await next_batch(out)):
                    if ev is None:
                        done += 1
                        # Thinking failed: the response fails now and its speech stops (below)
                        # rather than a talker waiting out its thinker. Speech that fails alone
                        # lets the text answer go on (raised at the end).
                        if tasks[0].done() and not tasks[0].cancelled() and tasks[0].exception():
                            tasks[0].result()
                    else:
                        yield ev
            for t in tasks:  # re-raise a stage failure
                t.result()
            usage = final.get("usage")
            if usage is not None:
                usage.audio_prompt_tokens = p.audio_prompt_tokens
            finish = final.get("finish_reason", "stop")
            # Speech cut short of the text: by the talker's frame limit (UnitChunk.truncated), or at
            # a marker the talker stopped at that began no call (what follows is content it never read).
            if finish == "stop" and (final.get("speech_cut") or marked.is_set()):
                finish = "length"
            yield Event(finish_reason=finish, usage=usage, tokens=final.get("unsent", 0))
        finally:
            for t in tasks:
                t.cancel()
            # The quota keeps what was used: the whole usage, or — a client that left, a stage that
            # failed — the prompt and the tokens generated until then; the rest goes back.
            usage = final.get("usage")
            text_tokens = (
                usage.prompt_tokens + usage.completion_tokens
                if usage is not None
                else p.prompt_tokens + final.get("generated", 0)
            )
            await self._release(p.lease, dataclasses.replace(p.lease.cost, text_tokens=text_tokens))

    async def _release(self, lease: Lease, used: Cost) -> None:
        """The quota keeps `used`. Its own task, awaited through a shield: a client that left
        cancels the response's generator and every await in it, but not the release."""
        release = asyncio.create_task(self.quota.release(lease, used))
        self._releasing.add(release)
        release.add_done_callback(self._releasing.discard)
        await asyncio.shield(release)

    async def _voice(self, p: Prepared, talk: stages_pb2.TalkRequest, out: asyncio.Queue, transcript) -> bool:
        """One talker stream to PCM: with async chunk its units are vocoded as they arrive, each call
        with the context that makes it equal to a whole-utterance decode; without, each stage waits
        for the whole output of the one before (the baseline). `transcript()` gives the text that
        goes with the next audio. Whether the talker's frame limit cut the speech."""
        vocoder = self.profile.models.vocoder  # present: validation rejected audio out otherwise
        talked = self.h.talker.options(stream=True).Talk.remote(talk)
        if talk.HasField("thinker"):  # a token talker waits on the thinker's tokens as well
            gap, d = self.profile.pipeline.thinker_gap_s(), self.deadlines
            talked = d.stream("talker", talked, reply_s=gap + d.reply_s, between_s=gap + d.between_s)
        else:
            talked = self.deadlines.stream("talker", talked)
        truncated = False

        async def units_of() -> AsyncIterator[np.ndarray]:
            nonlocal truncated
            async for uc in talked:
                if uc.is_final:
                    truncated = uc.truncated
                else:
                    yield await tensors.materialized(uc.units)

        units = units_of()
        if self.async_chunk:
            window = VocoderWindow(vocoder.context_frames, vocoder.lookahead_frames)
            async for chunk in units:
                if call := window.push(chunk):
                    await self._vocode(p, call, out, transcript())
            if call := window.flush():
                await self._vocode(p, call, out, transcript())
        else:
            whole = [u async for u in units]
            if whole:
                call = VocodeCall(np.concatenate(whole), None, None)
                await self._vocode(p, call, out, transcript(), split_s=WHOLE_AUDIO_PIECE_S)
        return truncated

    async def _vocode(
        self,
        p: Prepared,
        call: VocodeCall,
        out: asyncio.Queue,
        transcript: str | None,
        split_s: float | None = None,
    ) -> None:
        req = stages_pb2.VocodeRequest(ctx=p.ctx, units=tensors.describe(call.units), voice=p.voice)
        if call.left is not None:
            req.left_context.CopyFrom(tensors.describe(call.left))
        if call.right is not None:
            req.right_context.CopyFrom(tensors.describe(call.right))
        chunk = await self.deadlines.reply("vocoder", self.h.vocoder.Vocode.remote(req))
        p.resampler = p.resampler or StreamResampler(chunk.sample_rate)
        pcm = p.resampler.push(chunk.pcm16)
        step = len(pcm) if split_s is None else max(2, int(split_s * OUTPUT_RATE) * 2)
        for k in range(0, len(pcm), step):
            await out.put(
                Event(
                    pcm16=pcm[k : k + step],
                    sample_rate=OUTPUT_RATE,
                    transcript=transcript if k == 0 else None,
                )
            )

    @staticmethod
    async def _end_speech(p: Prepared, out: asyncio.Queue) -> None:
        """The last samples the response's resampler held back."""
        if p.resampler is not None and (pcm := p.resampler.flush()):
            await out.put(Event(pcm16=pcm, sample_rate=OUTPUT_RATE))

    # ---- the audio endpoints: speech alone, transcription alone ----------------------------

    async def prepare_speech(self, turn: SpeechTurn, tenant: TenantSpec) -> Prepared:
        """Text to speech: validated and admitted (its text tokens) before any audio is made."""
        self._check_model(turn.model)
        if why := self.profile.speech_out_unavailable():
            raise bad_request(why, code="unsupported_modality", param="model")
        if not turn.input.strip():
            raise bad_request("input must not be empty", param="input")
        if len(turn.input) > MAX_SPEECH_CHARS:
            raise bad_request(f"input must be at most {MAX_SPEECH_CHARS} characters", param="input")
        if turn.instructions:
            raise bad_request(
                f"profile {self.profile.name!r}'s talker takes no speaking instructions",
                code="unsupported_parameter",
                param="instructions",
            )
        voice = self._voice_named(turn.voice, "voice")
        ctx = common_pb2.RequestContext(request_id=f"speech-{uuid.uuid4().hex}", tenant=tenant.id)
        with telemetry.tracer("gateway").start_as_current_span("gateway.prepare_speech"):
            telemetry.inject(ctx)
            # A token talker speaks the thinker's tokens: the text as the assistant's answer to it.
            said = Turn(turn.model, (Message("user", (turn.input,)),))
            layout = self._layout(said)
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
        text = p.turn.messages[0].parts[0]
        seconds = 0.0

        async def speak() -> None:
            try:
                with stage_calls():
                    if self.token_talker:
                        await self._speak_tokens(p, text, out)
                    else:
                        for index, piece in enumerate(_spoken_pieces(text, self.profile)):
                            talk = stages_pb2.TalkRequest(
                                ctx=p.ctx, text=piece, voice=p.voice, chunk_index=index
                            )
                            await self._voice(p, talk, out, lambda: None)
                    await self._end_speech(p, out)
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
            await self._release(p.lease, p.lease.cost)

    async def _speak_tokens(self, p: Prepared, text: str, out: asyncio.Queue) -> None:
        """A token talker reads the text's tokens from a token stream, written here as decode would
        write an answer's."""
        stream = token_stream.key(p.ctx.request_id)
        ids, placements = expanded_ids(p.prompt)
        talk = stages_pb2.TalkRequest(
            ctx=p.ctx,
            voice=p.voice,
            thinker=stages_pb2.ThinkerOutput(prompt_ids=ids, media=placements, token_stream=stream),
        )
        self._token_redis = self._token_redis or async_client()
        writer = token_stream.TokenStreamWriter(stream, self._token_redis)
        answer = self.prompts.tokenizer.encode(text, add_special_tokens=False)
        await writer.add(answer)
        await writer.end()
        await self._voice(p, talk, out, lambda: None)

    async def prepare_transcription(
        self, turn: TranscriptionTurn, tenant: TenantSpec, api: str, *, paid: bool = False
    ) -> Transcription:
        """Speech to text: validated and admitted (the clip's audio seconds), unless its audio is
        `paid` for already (a realtime session's turn)."""
        self.check_transcription(turn)
        ctx = common_pb2.RequestContext(request_id=f"transcription-{uuid.uuid4().hex}", tenant=tenant.id)
        telemetry.inject(ctx)
        lease = None
        if not paid:
            cost = Cost(audio_seconds=turn.audio.seconds)
            lease = await self.quota.admit(tenant, ctx.request_id, cost, slo_class(tenant))
        return Transcription(turn, ctx, lease, api)

    def check_transcription(self, turn: TranscriptionTurn) -> None:
        """What this deployment's transcriber cannot do, as a 400 (before any audio is decoded)."""
        self._check_model(turn.model)
        spec = self.profile.models.transcriber_spec()
        if spec is None:
            raise bad_request(
                f"profile {self.profile.name!r} has no transcription model",
                code="unsupported_modality",
                param="model",
            )
        languages = spec.options.languages
        if turn.language and turn.language not in languages:
            raise bad_request(
                f"language {turn.language[:16]!r} is not transcribed here; one of {languages}",
                code="unsupported_language",
                param="language",
            )
        if len(turn.prompt) > MAX_TRANSCRIPTION_PROMPT_CHARS:
            raise bad_request(
                f"prompt must be at most {MAX_TRANSCRIPTION_PROMPT_CHARS} characters", param="prompt"
            )

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
                await self._release(t.lease, t.lease.cost)

    def _voice_named(self, name: str | None, param: str) -> str:
        """The profile's voice for `name` (an own name or an alias; None: the default), or a 400."""
        voice = self.profile.voice(name or self.profile.pipeline.default_voice)
        if voice is None:
            raise bad_request(
                f"unknown voice {(name or '')[:64]!r}; available: {self.profile.voice_names()}", param=param
            )
        return voice

    def _check_model(self, model: str) -> None:
        if not self.profile.serves(model):
            raise OmniError(
                400,
                f"model {model[:64]!r} does not exist; this server serves {self.profile.served_model_name!r}",
                code="model_not_found",
                param="model",
            )


@dataclass
class Transcription:
    turn: TranscriptionTurn
    ctx: common_pb2.RequestContext
    lease: Lease | None  # None: its audio was paid for already
    api: str  # who asked (the transcribed-seconds metric's label)


# OpenAI's limits for the audio endpoints' text
MAX_SPEECH_CHARS = 4096
MAX_TRANSCRIPTION_PROMPT_CHARS = 4096
_CLAUSE = re.compile(r"\S+\s*")


def _spoken_pieces(text: str, profile: Profile) -> list[str]:
    """Text for a text talker, cut where chat answers are cut (clause boundaries, a few words on):
    the first audio comes after the first clause, not the whole text."""
    chunker = TextChunker(profile.pipeline.chunk_min_tokens, profile.pipeline.chunk_max_tokens)
    pieces = [piece for word in _CLAUSE.findall(text) if (piece := chunker.push(word, 1))]
    if (rest := chunker.flush()) and rest.strip():
        pieces.append(rest)
    return pieces


async def _owned(out: stages_pb2.EncodedItem, item: AudioClip | ImageInput) -> stages_pb2.EncodedItem:
    """An encoder output this process can keep using: features left in the object store by the
    encoder replica (pinned there only for a while) are taken into an object this process owns,
    pinned for as long as the item that holds them lives (a realtime session's turn)."""
    if out.WhichOneof("output") != "embeddings" or out.embeddings.WhichOneof("location") != "object_ref":
        return out
    kept = tensors.Kept(await tensors.materialized(out.embeddings), out.embeddings)
    item.keepalive.append(kept)
    owned = stages_pb2.EncodedItem()
    owned.CopyFrom(out)
    owned.embeddings.CopyFrom(kept.descriptor)
    return owned
