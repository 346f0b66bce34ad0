"""The thinker engine: vLLM AsyncLLM behind the prefill and decode stages.

Both engines run the KV store's connector (kv_store/connector/): prefill computes the prompt's KV
and saves it as pages; decode loads them (pulled over NIXL) instead of recomputing the prompt, and
streams tokens; a session's next turn, or any prompt sharing a prefix, loads what the store holds.
Prompts arrive as token spans and embedding spans (encoder output). Embeddings the thinker model
places itself (a MediaPlacement: Qwen3-Omni's image and audio inputs) become placeholder tokens and
vLLM multimodal embeddings, positioned by the model (M-RoPE); any other embedding span turns the
whole prompt into vLLM prompt embeddings built with the thinker's own embedding table.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from omni.v1 import common_pb2, stages_pb2

from services.common.paths import data_dir
from services.common.redis_config import redis_url
from services.common.shm import ShmLedger
from services.dataplane import tensors
from services.engine.session_kv import GAVE_UP, SessionKv
from services.engine.session_kv import export_metrics as export_session_kv_metrics
from services.extensions.ray.metrics import metric
from services.extensions.vllm.media_rows import EXTRA_ARG as MEDIA_ROWS_ARG
from services.extensions.vllm.media_rows import media_row_keys
from services.extensions.vllm.specs import EC_ITEM_PREFIX, BlockOrderParams, EnginePayload, UrgencyPayload
from services.models.profile import Profile
from services.models.versions import FeatureVersionMismatch, FeatureVersions, model_version

Role = Literal["prefill", "decode"]
MEDIA_ROWS_WORKER = "services.extensions.vllm.media_rows.MediaRowsWorker"
FRAME = "omniray_scheduler_frame_seconds{}"  # its key in engine_metrics.TOTALS (a histogram: _count, _sum)
_NO_CONTEXT = common_pb2.RequestContext()


def _engine_env(profile: Profile, role: Role) -> dict[str, str]:
    return {
        "VLLM_CPU_OMP_THREADS_BIND": profile.engine.cpu_threads_bind.get(role, "auto"),
        "VLLM_CPU_KVCACHE_SPACE": str(profile.engine.kv_cache_space_gib),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        # UCX over loopback needs tcp; shared memory for same-node pulls (the KV store's NIXL).
        "UCX_TLS": os.environ.get("UCX_TLS", "tcp,sm,self"),
    }


@dataclass
class DecodeDelta:
    token_ids: list[int]
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # On a response's first delta: where the thinker's rows at its media placeholders are
    # (services/extensions/vllm/media_rows.py), for a token talker.
    media_rows: tuple[str, ...] = ()

    @staticmethod
    def merge(deltas: list[DecodeDelta]) -> DecodeDelta:
        last = deltas[-1]
        return DecodeDelta(
            token_ids=[t for d in deltas for t in d.token_ids],
            text="".join(d.text for d in deltas),
            finish_reason=last.finish_reason,
            prompt_tokens=last.prompt_tokens,
            completion_tokens=last.completion_tokens,
            cached_tokens=last.cached_tokens,
            media_rows=next((d.media_rows for d in deltas if d.media_rows), ()),
        )


def _media_inputs(placed: list[tuple[stages_pb2.MediaPlacement, np.ndarray | str]]) -> tuple[dict, dict]:
    """vLLM's `multi_modal_data` for encoder outputs the model places itself, per modality in prompt
    order (the keys services/extensions/vllm/qwen3_omni_thinker.py accepts), and its
    `multi_modal_uuids`: images streamed over NIXL (a feature key instead of an array) carry only
    their grid and are named for the EC connector (services/extensions/vllm/ec_connector.py)."""
    images = [(pl, x) for pl, x in placed if pl.modality == "image"]
    videos = [(pl, x) for pl, x in placed if pl.modality == "video"]
    audio = [(pl, x) for pl, x in placed if pl.modality == "audio"]
    if len(images) + len(videos) + len(audio) != len(placed):
        raise ValueError(f"unknown media modality in {sorted({pl.modality for pl, _ in placed})}")
    streamed = [x for _, x in placed if isinstance(x, str)]
    if streamed and (len(streamed) != len(images) or any(isinstance(x, str) for _, x in videos + audio)):
        raise ValueError("streamed encoder features must be every image of a prompt, and only images")
    data: dict = {}
    uuids: dict = {}
    if images:
        data["image"] = {"image_grid_thw": torch.tensor([list(pl.grid_thw) for pl, _ in images], dtype=torch.long)}
        if streamed:
            uuids["image"] = [EC_ITEM_PREFIX + key for key in streamed]
        else:
            data["image"]["image_embeds"] = torch.from_numpy(np.concatenate([x for _, x in images]).astype(np.float32))
    if videos:
        data["video"] = {
            "video_embeds": torch.from_numpy(np.concatenate([x for _, x in videos]).astype(np.float32)),
            "video_grid_thw": torch.tensor([list(pl.grid_thw) for pl, _ in videos], dtype=torch.long),
            "second_per_grid_ts": torch.tensor(
                [pl.seconds_per_grid for pl, _ in videos], dtype=torch.float32
            ),
        }
    if audio:
        data["audio"] = {
            "audio_embeds": torch.from_numpy(np.concatenate([x for _, x in audio]).astype(np.float32)),
            "audio_feature_lengths": torch.tensor([pl.feature_frames for pl, _ in audio], dtype=torch.long),
        }
    return data, uuids


def vllm_prompt(
    prompt: stages_pb2.Prompt, llm_version: str, embed_table: Callable[[], torch.Tensor], salt: str = ""
) -> tuple[dict, int, list | None]:
    """The vLLM prompt, its length in tokens, and its segments as the KV store names them (None
    for a plain token prompt, which the store hashes itself). `salt` (the tenant) goes to vLLM's
    prefix cache as its `cache_salt`: one tenant's `cached_tokens` and timings reveal nothing
    about another's prompts. `embed_table` gives the thinker's token embedding table (read only for
    prompts with plain prompt embeddings)."""
    spans: list[tuple[str, np.ndarray]] = []
    segments: list = []
    placed: list[tuple[stages_pb2.MediaPlacement, np.ndarray | str]] = []
    expanded = 0  # placeholder tokens vLLM adds
    for seg in prompt.segments:
        if seg.WhichOneof("segment") == "tokens":
            spans.append(("ids", np.asarray(seg.tokens.ids, dtype=np.int64)))
            segments.append(list(seg.tokens.ids))
            continue
        # Feature tensors projected for another LLM are rejected (which encoder version made
        # them is the gateway's check: it knows the deployment's encoders).
        found = seg.embeddings.producer_version
        if FeatureVersions.parse(found).llm != llm_version:
            raise FeatureVersionMismatch(found, f"llm={llm_version}")
        if seg.embeddings.WhichOneof("location") == "feature_key":
            # Streamed: still being encoded, read by the EC connector. Its key names the encoder
            # input, tenant, version and grid — what the features are a function of.
            if not seg.HasField("placement"):
                raise ValueError("streamed encoder features need a placement")
            features = key = seg.embeddings.feature_key
            rows = int(seg.embeddings.shape[0])
            digest = hashlib.sha256(key.encode()).hexdigest()
        else:
            features = tensors.materialize(seg.embeddings)
            rows = len(features)
            # KV depends on the feature values alone: name the span by them (the media's own
            # hash would not tell two tile grids of one image apart).
            digest = hashlib.sha256(np.ascontiguousarray(features).tobytes()).hexdigest()
        media = {"media": digest, "encoder": found, "tokens": rows}
        if not seg.HasField("placement"):
            spans.append(("emb", features))
            segments.append(media)
            continue
        # The model's own media input: one placeholder in the prompt, which vLLM's processor
        # expands to one per row (the rows travel beside the prompt).
        pl = seg.placement
        placed.append((pl, features))
        ids = [*pl.prefix_ids, pl.placeholder_id, *pl.suffix_ids]
        spans.append(("ids", np.asarray(ids, dtype=np.int64)))
        segments.extend(s for s in (list(pl.prefix_ids), media, list(pl.suffix_ids)) if s)
        expanded += rows - 1
    n_tokens = sum(len(x) for _, x in spans) + expanded
    salted = {"cache_salt": salt} if salt else {}
    if all(kind == "ids" for kind, _ in spans):
        ids = [int(t) for _, ids in spans for t in ids]
        if placed:
            data, uuids = _media_inputs(placed)
            named = {"multi_modal_uuids": uuids} if uuids else {}
            return (
                {"prompt_token_ids": ids, "multi_modal_data": data, **named, **salted},
                n_tokens,
                segments,
            )
        return {"prompt_token_ids": ids, **salted}, n_tokens, None
    if placed:
        raise ValueError("a prompt mixes plain prompt embeddings with placed media inputs")
    table = embed_table()
    parts = [
        table[torch.from_numpy(x)] if kind == "ids" else torch.from_numpy(x.astype(np.float32))
        for kind, x in spans
    ]
    # Same dtype every time: vLLM's prefix cache hashes the raw embedding bytes.
    embeds = torch.cat(parts).to(torch.float32).contiguous()
    return {"prompt_embeds": embeds, **salted}, n_tokens, segments


def _extensions(profile: Profile, role: Role, model_path: Path) -> dict:
    """The engine arguments of this role's extensions (their payload included)."""
    args: dict = {}
    urgency_payload = sink_window_params = None
    if role == "decode":  # realtime urgency applies where tokens stream to listeners
        spec = profile.realtime.scheduler
        urgency_payload = UrgencyPayload(
            policy=spec.policy,
            params=spec.params,
            board_url=redis_url(),
            poll_s=spec.board_interval_s,
            piece_tokens=profile.audio_piece_tokens(),
            # next-use eviction reaches vLLM's own block pool too (block_order.py)
            block_order=BlockOrderParams() if profile.kv_store.policy == "next_use" else None,
        )
        sink_window_params = profile.engine.sink_window
    if sink_window_params is not None:
        from services.extensions.vllm import sink_window

        layers = json.loads((model_path / "config.json").read_text())["num_hidden_layers"]
        args.update(sink_window.engine_args(sink_window_params, layers))
    payload = EnginePayload(urgency=urgency_payload, sink_window=sink_window_params)
    if profile.encoder_pool.stream_mib:  # encoder features streamed to the thinker over NIXL
        from vllm.config import ECTransferConfig

        from services.extensions.vllm.plugin import EC_CONNECTOR

        args["ec_transfer_config"] = ECTransferConfig(
            ec_connector=EC_CONNECTOR,
            ec_role="ec_consumer",
            ec_connector_extra_config={"redis_url": redis_url(), "wait_s": profile.encoder_pool.stream_wait_s},
        )
    if payload.urgency or payload.sink_window or profile.encoder_pool.stream_mib:  # else vLLM's own
        args["scheduler_cls"] = "services.extensions.vllm.scheduler.OmnirayScheduler"
        args["additional_config"] = payload.additional_config()
    return args


class ThinkerEngine:
    def __init__(self, profile: Profile, role: Role):
        from vllm.config import KVTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from services.extensions.vllm.stat_logger import EngineStatLogger

        os.environ.update(_engine_env(profile, role))
        self.role = role
        self.model_path = profile.model_path(profile.models.thinker)
        self.llm_version = model_version(profile, profile.models.thinker)
        kv_config = None
        self.kv_enabled = profile.engine.kv_transfer == "store"
        if self.kv_enabled:
            kv = profile.kv_store
            l3_dir = Path(kv.l3_dir) if Path(kv.l3_dir).is_absolute() else data_dir() / kv.l3_dir
            kv_config = KVTransferConfig(
                kv_connector="OmniKvConnector",
                kv_connector_module_path="services.extensions.vllm.kv_connector",
                kv_role="kv_both",
                # A page that cannot be loaded is recomputed, never an error.
                kv_load_failure_policy="recompute",
                kv_connector_extra_config={
                    "redis_url": redis_url(),
                    "llm_version": self.llm_version,
                    "l2_bytes": kv.l2_mib << 20,
                    "l3_path": str(l3_dir) if kv.l3_mib else "",
                    "l3_bytes": kv.l3_mib << 20,
                    "policy": kv.policy,
                    "policy_params": kv.policy_params,
                    "transfer_timeout_s": kv.transfer_timeout_s,
                    "session_board": "services.playback.board:BoardReader" if kv.session_signals else "",
                    "board_interval_s": profile.realtime.scheduler.board_interval_s,
                    "follower": kv.follower,
                },
            )
        extensions = _extensions(profile, role, self.model_path)
        args = AsyncEngineArgs(
            model=str(self.model_path),
            served_model_name=profile.served_model_name,
            dtype=profile.engine.dtype,
            max_model_len=profile.engine.max_model_len,
            enforce_eager=profile.engine.enforce_eager,
            max_num_seqs=profile.engine.max_num_seqs,
            stream_interval=profile.engine.stream_interval,
            enable_prompt_embeds=True,
            block_size=profile.engine.block_size,
            kv_transfer_config=kv_config,
            # Structured output by xgrammar (the gateway compiles schemas with it first), as
            # compact JSON: with whitespace allowed between tokens, a weak model can write
            # whitespace until max_tokens (tiny does at once) and never close the object.
            structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
            **extensions,
            **profile.engine.extra,
        )
        # Segments of engines that died on this node without unlinking theirs, freed before this
        # one takes its own; this one's are recorded for whoever starts after it dies.
        # the series exists (at 0) before any engine dies
        ledger, reclaimed = ShmLedger(), metric("omniray_engine_shm_reclaimed_total")
        if freed := ledger.sweep():
            reclaimed.inc(len(freed))
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[EngineStatLogger])
        ledger.record()
        # A model whose rows at the media go to a talker (profile: engine.extra.worker_extension_cls).
        self.media_rows = profile.engine.extra.get("worker_extension_cls") == MEDIA_ROWS_WORKER
        self._media_rows_on = False
        self._embed_table: torch.Tensor | None = None
        self._frame = (0.0, 0.0, 0.0)  # the frame histogram's count and sum at the last look, the mean
        self.session_kv: SessionKv | None = None
        if role == "decode" and profile.engine.session_kv is not None:
            bound = profile.engine.sink_window
            self.session_kv = SessionKv(self.engine, profile.engine.session_kv, bound.sink_tokens,
                                        bound.window_tokens, profile.engine.max_model_len)  # fmt: skip
        elif role == "decode":
            export_session_kv_metrics()  # zeros: the dashboard's series exist

    # -- prompts --------------------------------------------------------------------------

    def _embeddings(self) -> torch.Tensor:
        if self._embed_table is None:
            from safetensors import safe_open

            for shard in sorted(Path(self.model_path).glob("*.safetensors")):
                with safe_open(str(shard), "pt") as f:
                    if "model.embed_tokens.weight" in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                        self._embed_table = f.get_tensor("model.embed_tokens.weight").float()
                        break
            if self._embed_table is None:
                raise RuntimeError(f"no embedding table in {self.model_path}")
        return self._embed_table

    def engine_prompt(self, prompt: stages_pb2.Prompt, salt: str = "") -> tuple[dict, int, list | None]:
        return vllm_prompt(prompt, self.llm_version, self._embeddings, salt)

    @staticmethod
    def kv_params(segments: list | None, ctx: common_pb2.RequestContext, kind: str, **extra) -> dict:
        """kv_transfer_params for the store's connector (see services/extensions/vllm/kv_connector.py). Pages
        are salted with the tenant: one tenant's cache hits reveal nothing about another's prompts."""
        omniray: dict = {"kind": kind, "salt": ctx.tenant}
        if segments is not None:
            omniray["segments"] = segments
        if ctx.session_id:
            omniray["session"] = ctx.session_id
        if ctx.trace_context:
            omniray["trace"] = dict(ctx.trace_context)
        return {"omniray": omniray, **extra}

    @staticmethod
    def sampling_params(
        sampling: common_pb2.SamplingParams,
        *,
        kv_transfer_params: dict | None,
        max_tokens: int | None = None,
        session_id: str = "",
        media_rows: list | None = None,
    ):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        from services.extensions.vllm.scheduler import SESSION_ARG

        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else {}
        if session_id:  # the scheduler's key into the session board
            extra[SESSION_ARG] = session_id
        if media_rows:  # the worker writes these items' rows for the talker
            extra[MEDIA_ROWS_ARG] = [list(r) for r in media_rows]
        structured = None
        # Decode's tokens follow the schema; prefill's one token is dropped (no grammar to build).
        if max_tokens is None and (sampling.json_schema or sampling.json_object):
            structured = StructuredOutputsParams(
                json=sampling.json_schema or None, json_object=sampling.json_object or None
            )
        return SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.top_p > 0 else 1.0,
            seed=sampling.seed or None,
            stop=list(sampling.stop) or None,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=structured,
            extra_args=extra or None,
        )

    # -- stage operations -----------------------------------------------------------------

    async def prefill(
        self,
        request_id: str,
        prompt: stages_pb2.Prompt,
        sampling: common_pb2.SamplingParams,
        ctx: common_pb2.RequestContext = _NO_CONTEXT,
    ) -> tuple[int, str]:
        """Compute the prompt KV and save it in the store; returns (prompt tokens, kv_transfer_params
        JSON for decode)."""
        engine_prompt, n_tokens, segments = self.engine_prompt(prompt, ctx.tenant)
        kind = "session" if ctx.session_id else "prefix"
        kv = self.kv_params(segments, ctx, kind, do_remote_decode=True)
        rows = await self._media_rows(engine_prompt, segments, ctx.tenant)
        params = self.sampling_params(sampling, kv_transfer_params=kv, max_tokens=1, media_rows=rows)
        async for _ in self.engine.generate(engine_prompt, params, request_id=request_id):
            pass
        return n_tokens, json.dumps({"omniray": {"kind": "pd"}})

    async def decode(
        self,
        request_id: str,
        prompt: stages_pb2.Prompt,
        sampling: common_pb2.SamplingParams,
        kv_transfer_params: str,
        ctx: common_pb2.RequestContext = _NO_CONTEXT,
    ) -> AsyncIterator[DecodeDelta]:
        engine_prompt, n_tokens, segments = self.engine_prompt(prompt, ctx.tenant)
        handed = json.loads(kv_transfer_params) if kv_transfer_params else {}
        kind = handed.get("omniray", {}).get("kind") or ("session" if ctx.session_id else "prefix")
        kv = self.kv_params(segments, ctx, kind) if self.kv_enabled else None
        rows = await self._media_rows(engine_prompt, segments, ctx.tenant)
        params = self.sampling_params(
            sampling, kv_transfer_params=kv, session_id=ctx.session_id, media_rows=rows
        )
        completion = 0
        media_rows = tuple(key for _, _, key in rows)
        if self._session_turn(engine_prompt, params, ctx):
            key = f"{ctx.tenant}/{ctx.session_id}"
            outputs = self.session_kv.turn(key, engine_prompt["prompt_token_ids"], params, request_id)
        else:
            outputs = self.engine.generate(engine_prompt, params, request_id=request_id)
        # closed with this generator, not when collected: a consumer that leaves ends the request now
        async with contextlib.aclosing(outputs):
            async for out in outputs:
                c = out.outputs[0]
                if out.finished and c.finish_reason in GAVE_UP:
                    return  # the stream ends unanswered: the pipeline resumes the response elsewhere
                completion += len(c.token_ids)
                yield DecodeDelta(
                    media_rows=media_rows if completion == len(c.token_ids) else (),
                    token_ids=list(c.token_ids),
                    text=c.text,
                    finish_reason=c.finish_reason if out.finished else None,
                    prompt_tokens=n_tokens,
                    completion_tokens=completion,
                    cached_tokens=out.num_cached_tokens or 0,
                )

    def _session_turn(self, engine_prompt: dict, params, ctx: common_pb2.RequestContext) -> bool:
        """Whether this decode is a turn of the session's long-lived request: a session's, token ids
        only (vLLM's streaming input takes no prompt embeddings or media), no stop strings or
        grammar (not supported there)."""
        return (
            self.session_kv is not None
            and bool(ctx.session_id)
            and engine_prompt.keys() <= {"prompt_token_ids", "cache_salt"}
            and not params.stop
            and params.structured_outputs is None
        )

    async def _media_rows(self, engine_prompt: dict, segments: list | None, salt: str) -> list:
        """(start, rows, key) of the prompt's placed media items when the model writes its rows for
        a talker (media_rows.py); the first call starts the writing in the engine's workers."""
        if not self.media_rows or "multi_modal_data" not in engine_prompt or not segments:
            return []
        if not self._media_rows_on:
            await self.engine.collective_rpc("omniray_capture_media_rows")
            self._media_rows_on = True
        return media_row_keys(segments, salt, self.llm_version)

    def frame_s(self) -> float:
        """The engine's frame time: its mean step period while busy since the last look (the
        scheduler's measurements reach this process with each step's stats); 0 before any."""
        from services.extensions.vllm.engine_metrics import TOTALS

        count = TOTALS.values.get(FRAME + "_count", 0.0)
        seen, total, _ = self._frame
        if count > seen:
            now_total = TOTALS.values.get(FRAME + "_sum", 0.0)
            self._frame = (count, now_total, (now_total - total) / (count - seen))
        return self._frame[2]

    def unfinished_requests(self) -> int:
        """Requests the engine still holds (a client that went away must leave none behind)."""
        return self.engine.get_num_unfinished_requests()

    def prompt_token_sources(self) -> dict[str, float]:
        """vLLM's own counter of where prompt tokens came from (computed / local cache / external KV)."""
        from prometheus_client import REGISTRY

        sources: dict[str, float] = {}
        for family in REGISTRY.collect():
            if family.name == "vllm:prompt_tokens_by_source":
                for s in family.samples:
                    if s.name.endswith("_total"):
                        sources[s.labels["source"]] = sources.get(s.labels["source"], 0.0) + s.value
        return sources

    @staticmethod
    def kv_store_totals() -> dict[str, float]:
        """The store's metrics replayed in this process (see kv_store/metrics.py)."""
        from services.extensions.vllm.engine_metrics import TOTALS

        return dict(TOTALS.values)

    def shutdown(self) -> None:
        if self.session_kv is not None:
            self.session_kv.stop()
        self.engine.shutdown()
