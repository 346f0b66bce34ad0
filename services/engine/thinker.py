"""The thinker engine: vLLM AsyncLLM behind the prefill and decode stages.

Prefill computes the prompt's KV and hands it to decode through a KV connector (NIXL on CPU and
GPU alike); decode continues from that KV without recomputing the prompt and streams tokens.
Prompts arrive as token spans and embedding spans (encoder output); any embedding span turns the
whole prompt into vLLM prompt embeddings built with the thinker's own embedding table.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from omni.v1 import common_pb2, stages_pb2

from services.common import tensors
from services.models.profile import Profile
from services.models.versions import FeatureVersionMismatch, FeatureVersions, model_version

Role = Literal["prefill", "decode"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _engine_env(profile: Profile, role: Role) -> dict[str, str]:
    return {
        "VLLM_CPU_OMP_THREADS_BIND": profile.engine.cpu_threads_bind.get(role, "auto"),
        "VLLM_CPU_KVCACHE_SPACE": str(profile.engine.kv_cache_space_gib),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        # UCX over loopback needs tcp; shared memory for same-node pulls.
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
        )


class ThinkerEngine:
    def __init__(self, profile: Profile, role: Role):
        from vllm.config import KVTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        os.environ.update(_engine_env(profile, role))
        self.role = role
        self.model_path = profile.model_path(profile.models.thinker)
        kv_config = None
        if profile.engine.kv_transfer == "nixl":
            # Each engine listens on its own side channel; decode learns prefill's from the
            # kv_transfer_params that prefill returns.
            import ray

            os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = ray.util.get_node_ip_address()
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(_free_port())
            from vllm.platforms import current_platform

            # On CPU, the same connector with transfers driven by polling (see nixl_cpu.py).
            cpu = current_platform.is_cpu()
            kv_config = KVTransferConfig(
                kv_connector="CpuNixlConnector" if cpu else "NixlConnector",
                kv_connector_module_path="services.engine.nixl_cpu" if cpu else None,
                kv_role="kv_producer" if role == "prefill" else "kv_consumer",
                kv_buffer_device="cpu",
            )
        args = AsyncEngineArgs(
            model=str(self.model_path),
            served_model_name=profile.served_model_name,
            dtype=profile.engine.dtype,
            max_model_len=profile.engine.max_model_len,
            enforce_eager=profile.engine.enforce_eager,
            max_num_seqs=profile.engine.max_num_seqs,
            stream_interval=profile.engine.stream_interval,
            enable_prompt_embeds=True,
            kv_transfer_config=kv_config,
            **profile.engine.extra,
        )
        self.engine = AsyncLLM.from_engine_args(args)
        self._embed_table: torch.Tensor | None = None
        # Feature tensors projected for another LLM are rejected (which encoder version made them is
        # the gateway's check: it knows the deployment's encoders).
        self.llm_version = model_version(profile, profile.models.thinker)

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

    def engine_prompt(self, prompt: stages_pb2.Prompt) -> tuple[dict, int]:
        """The vLLM prompt and its length in tokens."""
        spans: list[tuple[str, np.ndarray]] = []
        for seg in prompt.segments:
            if seg.WhichOneof("segment") == "tokens":
                spans.append(("ids", np.asarray(seg.tokens.ids, dtype=np.int64)))
            else:
                found = seg.embeddings.producer_version
                if FeatureVersions.parse(found).llm != self.llm_version:
                    raise FeatureVersionMismatch(found, f"llm={self.llm_version}")
                spans.append(("emb", tensors.materialize(seg.embeddings)))
        n_tokens = sum(len(x) for _, x in spans)
        if all(kind == "ids" for kind, _ in spans):
            return {"prompt_token_ids": [int(t) for _, ids in spans for t in ids]}, n_tokens
        table = self._embeddings()
        parts = [
            table[torch.from_numpy(x)] if kind == "ids" else torch.from_numpy(x.astype(np.float32))
            for kind, x in spans
        ]
        # Same dtype every time: vLLM's prefix cache hashes the raw embedding bytes.
        return {"prompt_embeds": torch.cat(parts).to(torch.float32).contiguous()}, n_tokens

    @staticmethod
    def sampling_params(
        sampling: common_pb2.SamplingParams, *, kv_transfer_params: dict | None, max_tokens: int | None = None
    ):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
        return SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.top_p > 0 else 1.0,
            seed=sampling.seed or None,
            stop=list(sampling.stop) or None,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra,
        )

    # -- stage operations -----------------------------------------------------------------

    async def prefill(
        self, request_id: str, prompt: stages_pb2.Prompt, sampling: common_pb2.SamplingParams
    ) -> tuple[int, str]:
        """Compute the prompt KV; returns (prompt tokens, kv_transfer_params JSON for decode)."""
        params = self.sampling_params(sampling, kv_transfer_params={"do_remote_decode": True}, max_tokens=1)
        engine_prompt, n_tokens = self.engine_prompt(prompt)
        final = None
        async for out in self.engine.generate(engine_prompt, params, request_id=request_id):
            final = out
        return n_tokens, json.dumps(final.kv_transfer_params or {})

    async def decode(
        self,
        request_id: str,
        prompt: stages_pb2.Prompt,
        sampling: common_pb2.SamplingParams,
        kv_transfer_params: str,
    ) -> AsyncIterator[DecodeDelta]:
        kv = json.loads(kv_transfer_params) if kv_transfer_params else None
        params = self.sampling_params(sampling, kv_transfer_params=kv)
        engine_prompt, n_tokens = self.engine_prompt(prompt)
        completion = 0
        async for out in self.engine.generate(engine_prompt, params, request_id=request_id):
            c = out.outputs[0]
            completion += len(c.token_ids)
            yield DecodeDelta(
                token_ids=list(c.token_ids),
                text=c.text,
                finish_reason=c.finish_reason if out.finished else None,
                prompt_tokens=n_tokens,
                completion_tokens=completion,
                cached_tokens=out.num_cached_tokens or 0,
            )

    def prompt_token_sources(self) -> dict[str, float]:
        """vLLM's own counter of where prompt tokens came from (computed / local cache / external KV)."""
        from prometheus_client import REGISTRY

        sources: dict[str, float] = {}
        for metric in REGISTRY.collect():
            if metric.name == "vllm:prompt_tokens_by_source":
                for s in metric.samples:
                    if s.name.endswith("_total"):
                        sources[s.labels["source"]] = sources.get(s.labels["source"], 0.0) + s.value
        return sources

    def shutdown(self) -> None:
        self.engine.shutdown()
