"""The request pipeline behind both the REST and the gRPC API.

prepare(): validate, decode media, run the encoder pool, build the thinker prompt (every client
error surfaces here, before any response byte is sent). generate(): prefill -> decode streams
text; with audio out, the talker starts on the first text piece (async chunk) and the vocoder on
the first unit chunk, so PCM streams while the thinker is still writing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from omni.v1 import common_pb2, omni_pb2, stages_pb2
from ray.serve.handle import DeploymentHandle

from services.common import telemetry, tensors
from services.common.errors import OmniError, bad_request, too_large
from services.common.streams import next_batch
from services.common.vocoder_window import VocodeCall, VocoderWindow
from services.gateway import media
from services.gateway.prompt import PromptBuilder
from services.gateway.text_chunker import TextChunker
from services.models.profile import Profile
from services.models.versions import FeatureVersionMismatch, FeatureVersions
from services.quota.service import Cost, Lease, QuotaService
from services.quota.tenants import TenantSpec
from services.router.plan import StagePlan, plan, slo_class
from services.router.tiles import TILE_POLICY_VERSION, tile_grid

SUPPORTED_MODALITIES = {"text", "audio"}
# Without async chunk, whole-utterance audio is still sent to the client in pieces of this length.
WHOLE_AUDIO_PIECE_S = 0.5


@dataclass
class Event:
    text: str = ""
    tokens: int = 0  # generated tokens behind `text`
    pcm16: bytes = b""
    sample_rate: int = 0
    transcript: str | None = None
    finish_reason: str | None = None
    usage: common_pb2.Usage | None = None
    progress: common_pb2.Progress | None = None


def _merge_text(batch: list[Event | None]) -> list[Event | None]:
    """Consecutive text events that piled up become one (fewer chunks on the wire under load)."""
    merged: list[Event | None] = []
    for ev in batch:
        prev = merged[-1] if merged else None
        if ev is not None and prev is not None and _text_only(ev) and _text_only(prev):
            merged[-1] = Event(text=prev.text + ev.text, tokens=prev.tokens + ev.tokens)
        else:
            merged.append(ev)
    return merged


# name: (low, high) — OpenAI's ranges. top_p 0 means "not set" in the protobuf (1.0 then).
SAMPLING_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
MAX_STOP, MAX_STOP_CHARS = 4, 256


def _check_sampling(sampling: common_pb2.SamplingParams) -> None:
    """The sampling fields every API sends (gRPC's only check; REST's pydantic model has the same bounds)."""
    for name, (low, high) in SAMPLING_RANGES.items():
        value = getattr(sampling, name)
        if not (math.isfinite(value) and low <= value <= high):
            raise bad_request(f"{name} must be a number in [{low:g}, {high:g}]", param=name)
    if len(sampling.stop) > MAX_STOP or not all(0 < len(s) <= MAX_STOP_CHARS for s in sampling.stop):
        raise bad_request(
            f"stop takes at most {MAX_STOP} non-empty sequences of at most {MAX_STOP_CHARS} characters",
            param="stop",
        )


def prompt_tokens(prompt: stages_pb2.Prompt) -> int:
    return sum(len(s.tokens.ids) if s.HasField("tokens") else s.embeddings.shape[0] for s in prompt.segments)


def _text_only(ev: Event) -> bool:
    return bool(ev.text) and not ev.pcm16 and ev.finish_reason is None and ev.progress is None


@dataclass
class Prepared:
    request: omni_pb2.ChatRequest
    ctx: common_pb2.RequestContext
    plan: StagePlan
    items: list[stages_pb2.MediaItem]
    sampling: common_pb2.SamplingParams
    voice: str
    audio_format: str
    lease: Lease
    # Built in prepare(), except for documents: their encoding runs inside generate() so that
    # progress events stream to the client while the tiles are encoded.
    prompt: stages_pb2.Prompt | None = None
    prompt_tokens: int = 0


@dataclass
class StageHandles:
    encoder: DeploymentHandle
    prefill: DeploymentHandle
    decode: DeploymentHandle
    talker: DeploymentHandle
    vocoder: DeploymentHandle

    def grpc(self) -> StageHandles:
        """The same handles on Serve's gRPC transport between replicas."""
        return StageHandles(**{k: h.options(_by_reference=False) for k, h in vars(self).items()})


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
        self.h = handles.grpc()
        self.prompts = prompts
        self.quota = quota
        self.feature_versions = {
            m: FeatureVersions.for_profile(profile, m).encode() for m in ("image", "audio")
        }
        from ray.util import metrics

        self.version_mismatches = metrics.Counter(
            "omniray_encoder_feature_version_mismatch_total",
            description="Encoder outputs rejected for carrying other model versions (then re-encoded).",
            tag_keys=("modality",),
        )
        for modality in self.feature_versions:  # exported at 0: the alert and panel see a healthy run
            telemetry.zero(self.version_mismatches, modality=modality)
        self.async_chunk = profile.pipeline.async_chunk if async_chunk is None else async_chunk
        self._releasing: set[asyncio.Task] = set()  # quota releases that outlive their request

    # ---- validation and preparation -----------------------------------------------------

    def _validate(self, req: omni_pb2.ChatRequest) -> tuple[common_pb2.SamplingParams, str, str]:
        limits, pipe = self.profile.limits, self.profile.pipeline
        if req.model != self.profile.served_model_name:
            raise OmniError(
                400,
                f"model {req.model[:64]!r} does not exist; this server serves {self.profile.served_model_name!r}",
                code="model_not_found",
                param="model",
            )
        if not req.messages:
            raise bad_request("messages must not be empty", param="messages")
        if len(req.messages) > limits.max_messages:
            raise bad_request(f"at most {limits.max_messages} messages", param="messages")
        for i, m in enumerate(req.messages):
            if m.role not in ("system", "developer", "user", "assistant"):
                raise bad_request(f"unknown role {m.role!r}", param=f"messages.{i}.role")
        if len(req.modalities) > len(SUPPORTED_MODALITIES):
            raise bad_request("modalities lists each modality once", param="modalities")
        if len(req.session_id) > 128:
            raise bad_request("session id must be at most 128 characters", param="x-omniray-session-id")
        modalities = set(req.modalities or ["text"])
        if not modalities <= SUPPORTED_MODALITIES or "text" not in modalities:
            raise bad_request(
                f"unsupported modalities {sorted(modalities)}; use ['text'] or ['text', 'audio']",
                code="unsupported_modality",
                param="modalities",
            )
        if "audio" in modalities and (why := self.profile.speech_out_unavailable()):
            raise bad_request(
                f"{why}; use modalities ['text']",
                code="unsupported_modality",
                param="modalities",
            )
        voice = req.audio.voice or pipe.default_voice
        if voice not in pipe.voices:
            raise bad_request(f"unknown voice {voice[:64]!r}; available: {pipe.voices}", param="audio.voice")
        audio_format = req.audio.format or "pcm16"
        if audio_format not in media.AUDIO_FORMATS:
            raise bad_request(f"audio.format must be one of {media.AUDIO_FORMATS}", param="audio.format")
        sampling = common_pb2.SamplingParams()
        sampling.CopyFrom(req.sampling)
        if sampling.max_tokens < 0:
            raise bad_request("max_tokens must be positive", param="max_tokens")
        if sampling.max_tokens == 0:
            sampling.max_tokens = pipe.default_max_tokens
        if sampling.max_tokens > limits.max_tokens_cap:
            raise bad_request(f"max_tokens must be at most {limits.max_tokens_cap}", param="max_tokens")
        if not req.HasField("sampling"):
            sampling.temperature, sampling.top_p = 1.0, 1.0
        _check_sampling(sampling)
        return sampling, voice, audio_format

    def _inspect_media(self, req: omni_pb2.ChatRequest) -> list[stages_pb2.MediaItem]:
        """The request's media items from their headers alone (count, tiles, audio seconds, decoded
        size): what the plan and the quota need, before anything is decoded. `data` is filled by
        _load_media once the quota admitted the request."""
        limits, vision = self.profile.limits, self.profile.tiling
        parts = [
            (f"messages.{i}.content.{j}", part)
            for i, m in enumerate(req.messages)
            for j, part in enumerate(m.content)
        ]
        media_parts = [
            (param, part) for param, part in parts if part.WhichOneof("part") in ("image", "audio")
        ]
        if len(media_parts) > limits.max_media_items:
            raise bad_request(
                f"at most {limits.max_media_items} images and audio clips per request",
                code="too_many_media_items",
                param="messages",
            )
        if any(part.WhichOneof("part") is None for _, part in parts):
            raise bad_request(
                "empty content part", param=next(p for p, part in parts if not part.WhichOneof("part"))
            )
        items, decoded = [], 0
        for param, part in media_parts:
            kind = part.WhichOneof("part")
            if getattr(self.profile.models, "vision" if kind == "image" else "audio") is None:
                raise bad_request(
                    f"profile {self.profile.name!r} does not accept {kind} input",
                    code="unsupported_modality",
                    param=param,
                )
            if kind == "image":
                data = part.image.data or media.data_url_bytes(
                    part.image.url, param=param, limit=limits.max_image_bytes
                )
                header = media.inspect_image(data, limits, param=param)
                detail = part.image.detail or "auto"
                try:
                    grid = tile_grid(header.width, header.height, detail, vision.tile_px, vision.max_tiles)
                except ValueError:
                    raise bad_request(
                        "detail must be auto, low or high", param=f"{param}.image_url.detail"
                    ) from None
                item = stages_pb2.MediaItem(
                    modality="image",
                    detail=detail,
                    tiles=stages_pb2.TileGrid(
                        cols=grid.cols,
                        rows=grid.rows,
                        tile_px=grid.tile_px,
                        policy_version=TILE_POLICY_VERSION,
                    ),
                )
            else:
                header = media.inspect_audio(part.audio.data, part.audio.format or "wav", limits, param=param)
                item = stages_pb2.MediaItem(modality="audio", audio_seconds=header.seconds)
            decoded += header.decoded_bytes
            if decoded > limits.max_media_decoded_bytes:
                raise too_large(
                    f"the request's media decode to more than {limits.max_media_decoded_bytes} bytes",
                    code="media_too_large",
                    param="messages",
                )
            items.append(item)
        return items

    def _load_media(self, req: omni_pb2.ChatRequest, items: list[stages_pb2.MediaItem]) -> None:
        """Decode the inspected items and hand their bytes to the data plane."""
        media_parts = [
            (f"messages.{i}.content.{j}", part)
            for i, m in enumerate(req.messages)
            for j, part in enumerate(m.content)
            if part.WhichOneof("part") in ("image", "audio")
        ]
        for item, (param, part) in zip(items, media_parts, strict=True):
            if item.modality == "image":
                data = part.image.data or media.data_url_bytes(
                    part.image.url, param=param, limit=self.profile.limits.max_image_bytes
                )
                media.check_image_decodes(data, param=param)
                item.data.CopyFrom(tensors.describe_bytes(data))
            else:
                wave = media.decode_audio(
                    part.audio.data, part.audio.format or "wav", self.profile.limits, param=param
                )
                item.data.CopyFrom(tensors.describe_bytes(wave.tobytes()))

    async def _encode(
        self, ctx: common_pb2.RequestContext, items: list[stages_pb2.MediaItem], progress=None
    ) -> list[stages_pb2.EncodedItem]:
        """Encoder outputs whose versions match this deployment's; a mismatch (e.g. an encoder
        replica still on the previous version during a rollout) is counted and re-encoded once.
        With `progress`, the encoder streams progress events to it while it works."""
        request = stages_pb2.EncodeRequest(ctx=ctx, items=items)
        if progress is None:
            encoded = list((await self.h.encoder.Encode.remote(request)).items)
        else:
            async for event in self.h.encoder.options(stream=True).EncodeStream.remote(request):
                if event.HasField("progress"):
                    await progress(event.progress)
                else:
                    encoded = list(event.result.items)
        stale = self._stale(items, encoded)
        if stale:
            for modality in stale:
                self.version_mismatches.inc(tags={"modality": modality})
            request.bypass_cache = True
            request.require_versions.update({m: self.feature_versions[m] for m in stale})
            try:
                encoded = list((await self.h.encoder.Encode.remote(request)).items)
            except Exception as e:  # the replica cannot serve the version (raised in another process)
                if FeatureVersionMismatch.CODE not in str(e):
                    raise
                encoded = None
            if encoded is None or self._stale(items, encoded):
                raise OmniError(
                    503,
                    "encoder replicas serve other model versions than this gateway; retry shortly",
                    code=FeatureVersionMismatch.CODE,
                )
        return encoded

    def _stale(self, items: list[stages_pb2.MediaItem], encoded: list[stages_pb2.EncodedItem]) -> list[str]:
        return [
            item.modality
            for item, out in zip(items, encoded, strict=True)
            if out.encoder_version != self.feature_versions[item.modality]
        ]

    def _cost(self, req: omni_pb2.ChatRequest, stage_plan: StagePlan, max_tokens: int) -> Cost:
        return Cost(
            text_tokens=self.prompts.count_text_tokens(list(req.messages)) + max_tokens,
            image_tiles=stage_plan.tiles,
            audio_seconds=stage_plan.audio_seconds,
            document_pages=stage_plan.pages,
            encoder_gflops=stage_plan.tiles * self.profile.tiling.gflops_per_tile,
        )

    async def prepare(self, req: omni_pb2.ChatRequest, tenant: TenantSpec) -> Prepared:
        """Validate, plan, admit against the tenant's quota; encode media and build the prompt
        (documents: later, in generate(), with progress events)."""
        sampling, voice, audio_format = self._validate(req)
        slo = slo_class(tenant, req.slo_class, req.service_tier)
        ctx = common_pb2.RequestContext(
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            tenant=tenant.id,
            session_id=f"{tenant.id}/{req.session_id}" if req.session_id else "",
        )
        with telemetry.tracer("gateway").start_as_current_span("gateway.prepare") as span:
            telemetry.inject(ctx)
            items = await asyncio.to_thread(self._inspect_media, req)
            with telemetry.tracer("router").start_as_current_span("router.plan"):
                stage_plan = plan(req, items)
            span.set_attribute("omniray.request_class", stage_plan.request_class)
            span.set_attribute("omniray.slo_class", slo)
            with telemetry.tracer("quota").start_as_current_span("quota.admit") as qspan:
                # Counting text tokens runs the tokenizer: off the event loop.
                cost = await asyncio.to_thread(self._cost, req, stage_plan, sampling.max_tokens)
                lease = await self.quota.admit(tenant, ctx.request_id, cost, slo)
                qspan.set_attribute("omniray.queued_s", lease.queued_s)
            p = Prepared(req, ctx, stage_plan, items, sampling, voice, audio_format, lease)
            try:
                # Decoding and the object-store puts come after admission: a request over its
                # quota costs the gateway only header reads.
                await asyncio.to_thread(self._load_media, req, items)
                if stage_plan.request_class != "document":
                    await self._build_prompt(p)
            except BaseException:
                await self.quota.release(lease)
                raise
        return p

    async def _build_prompt(self, p: Prepared, progress=None) -> None:
        encoded: list[stages_pb2.EncodedItem] = []
        if p.plan.encode:
            encoded = await self._encode(p.ctx, p.items, progress)
        p.prompt = self.prompts.render(list(p.request.messages), encoded)
        p.prompt_tokens = prompt_tokens(p.prompt)
        if p.prompt_tokens + p.sampling.max_tokens > self.profile.engine.max_model_len:
            raise bad_request(
                f"prompt ({p.prompt_tokens} tokens) plus max_tokens ({p.sampling.max_tokens}) exceeds the "
                f"context length ({self.profile.engine.max_model_len})",
                code="context_length_exceeded",
                param="messages",
            )

    async def prefill_ahead(self, req: omni_pb2.ChatRequest, tenant: TenantSpec) -> int:
        """Speculative prefill of a turn still being spoken (realtime sessions): `req` holds the
        conversation with the turn's audio so far. Encode it and run it up to the end of its audio —
        the turn's closing template tokens are not known yet — through the session's prefill and
        decode replicas, as the turn itself will run, generating one token: prefill computes the
        KV, decode pulls it into its own cache, so when the whole turn comes both find all but its
        last chunk cached. Returns the prompt tokens (0 when there is no audio to prefill).

        Not debited from the quota: the turn's request pays for the same audio when it comes, and a
        session runs at most one of these at a time, only while its user speaks."""
        sampling, _, _ = self._validate(req)
        ctx = common_pb2.RequestContext(
            request_id=f"ahead-{uuid.uuid4().hex}",
            tenant=tenant.id,
            session_id=f"{tenant.id}/{req.session_id}",
        )
        with telemetry.tracer("gateway").start_as_current_span("gateway.prefill_ahead") as span:
            telemetry.inject(ctx)
            items = await asyncio.to_thread(self._inspect_media, req)
            await asyncio.to_thread(self._load_media, req, items)
            prompt = self.prompts.render(list(req.messages), await self._encode(ctx, items))
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
    ) -> AsyncIterator[stages_pb2.DecodeChunk]:
        """The thinker: prefill (for prompts long enough to pay for the hand-off) then decode,
        streamed. Turns of one session go to the replicas that served it before (session_affinity)."""
        kv_params = ""
        session = {"session_id": ctx.session_id} if ctx.session_id else {}
        if (
            self.profile.engine.kv_transfer != "none"
            and tokens >= self.profile.engine.disagg_min_prompt_tokens
        ):
            pre = await self.h.prefill.options(**session).Prefill.remote(
                stages_pb2.PrefillRequest(ctx=ctx, prompt=prompt, sampling=sampling)
            )
            kv_params = pre.kv_transfer_params
        request = stages_pb2.DecodeRequest(
            ctx=ctx, prompt=prompt, sampling=sampling, kv_transfer_params=kv_params
        )
        async for chunk in self.h.decode.options(stream=True, **session).Decode.remote(request):
            yield chunk

    # ---- generation ----------------------------------------------------------------------

    async def generate(self, p: Prepared) -> AsyncIterator[Event]:
        out: asyncio.Queue = asyncio.Queue()
        pieces: asyncio.Queue = asyncio.Queue()
        final: dict = {}

        async def think() -> None:
            try:
                if p.prompt is None:  # a document: encode now, streaming progress
                    await self._build_prompt(p, progress=lambda pr: out.put(Event(progress=pr)))
                await generate_text()
            finally:
                await pieces.put(None)  # speak() ends even when thinking failed

        async def generate_text() -> None:
            chunker = TextChunker(
                self.profile.pipeline.chunk_min_tokens, self.profile.pipeline.chunk_max_tokens
            )
            text = []
            async for chunk in self._think(p.ctx, p.prompt, p.prompt_tokens, p.sampling):
                final["generated"] = final.get("generated", 0) + len(chunk.token_ids)
                if chunk.text:
                    text.append(chunk.text)
                    await out.put(Event(text=chunk.text, tokens=len(chunk.token_ids)))
                    if (
                        p.plan.speak
                        and self.async_chunk
                        and (piece := chunker.push(chunk.text, len(chunk.token_ids)))
                    ):
                        await pieces.put(piece)
                if chunk.finish_reason:
                    final.update(finish_reason=chunk.finish_reason, usage=chunk.usage)
            if p.plan.speak:
                rest = chunker.flush() if self.async_chunk else "".join(text)
                if rest and rest.strip():
                    await pieces.put(rest)

        async def speak() -> None:
            vocoder = self.profile.models.vocoder  # present: validation rejected audio out otherwise
            index = 0
            while (piece := await pieces.get()) is not None:
                talk = stages_pb2.TalkRequest(ctx=p.ctx, text=piece, voice=p.voice, chunk_index=index)
                index += 1
                units = (
                    tensors.materialize(uc.units)
                    async for uc in self.h.talker.options(stream=True).Talk.remote(talk)
                    if not uc.is_final
                )
                if self.async_chunk:
                    # One talker stream is one utterance: vocode its units as they arrive, each
                    # call with the context that makes it equal to a whole-utterance decode.
                    window = VocoderWindow(vocoder.context_frames, vocoder.lookahead_frames)
                    transcript: str | None = piece
                    async for chunk in units:
                        if call := window.push(chunk):
                            await self._vocode(p, call, out, transcript)
                            transcript = None
                    if call := window.flush():
                        await self._vocode(p, call, out, transcript)
                else:
                    # Baseline: each stage waits for the whole output of the previous one.
                    whole = [u async for u in units]
                    if whole:
                        call = VocodeCall(np.concatenate(whole), None, None)
                        await self._vocode(p, call, out, piece, split_s=WHOLE_AUDIO_PIECE_S)

        async def run(coro) -> None:
            try:
                await coro
            finally:
                await out.put(None)

        tasks = [asyncio.create_task(run(think()))]
        if p.plan.speak:
            tasks.append(asyncio.create_task(run(speak())))
        try:
            done = 0
            while done < len(tasks):
                for ev in _merge_text(await next_batch(out)):
                    if ev is None:
                        done += 1
                    else:
                        yield ev
            for t in tasks:  # re-raise a stage failure
                t.result()
            yield Event(finish_reason=final.get("finish_reason", "stop"), usage=final.get("usage"))
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
            # Its own task, awaited through a shield: a client that left cancels this generator and
            # every await in it, but not the release.
            release = asyncio.create_task(
                self.quota.release(p.lease, dataclasses.replace(p.lease.cost, text_tokens=text_tokens))
            )
            self._releasing.add(release)
            release.add_done_callback(self._releasing.discard)
            await asyncio.shield(release)

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
        chunk = await self.h.vocoder.Vocode.remote(req)
        pcm, rate = chunk.pcm16, chunk.sample_rate
        step = len(pcm) if split_s is None else max(2, int(split_s * rate) * 2)
        for k in range(0, len(pcm), step):
            await out.put(
                Event(pcm16=pcm[k : k + step], sample_rate=rate, transcript=transcript if k == 0 else None)
            )
