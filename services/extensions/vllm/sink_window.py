"""Bounded per-session KV inside vLLM (Metronome): a request keeps its first S tokens (attention
sinks) and its last W tokens resident, and every query attends to keys in [0, S) ∪ [t−W, t], so a
long-lived realtime session holds at most ceil(S/block) + ceil(W/block) + 1 blocks however long it
runs, and the engine's pool occupancy plateaus instead of filling.

Wiring into vLLM 0.32 (all through its own extension points):
- The model's layers become sliding-window layers of width W+1 (`hf_overrides` `layer_types` /
  `sliding_window`; vLLM's window includes the query, ours counts W keys before it), so the worker
  lays the cache out as for any sliding-window model.
- Scheduler side: the `SinkWindowKv` hook of omniray's scheduler (services/extensions/vllm/scheduler.py)
  rewrites the sliding-window groups of the KV cache config into `SinkWindowSpec`, registered in vLLM's `KVCacheSpecRegistry` with `SinkWindowManager`: vLLM's
  `SlidingWindowManager` except that blocks behind the window are freed from the last sink block on
  (the sink blocks stay).
- Worker side: `sink_window_worker.SinkWindowWorker` (vLLM's `worker_extension_cls`, imported in each
  worker process before the model is built) registers `SinkWindowBackend` as the CPU attention backend: vLLM's CPU
  backend (same cache layout and cache writes) whose decoder layers attend through
  `kernels.sink_attention` (the torch reference on CPU, the Triton kernel for CUDA tensors).

Configured from the profile (`engine.sink_window: {sink_tokens, window_tokens}`), off by default;
the engine payload (services/extensions/vllm/specs.py) carries it to both processes.

Written for vLLM 0.32 (SlidingWindowSpec / SlidingWindowManager / KVCacheSpecRegistry, the CPU attention
backend and its cache layout); tests/unit/extensions/test_sink_window.py and
tests/integration/test_sink_window_engine.py drive the real ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from vllm.config import get_current_vllm_config
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import SlidingWindowSpec

from kernels import sink_attention
from services.extensions.vllm import pins
from services.extensions.vllm.specs import EnginePayload, SinkWindowParams

pins.check(__name__)


def engine_args(params: SinkWindowParams, num_layers: int) -> dict:
    """AsyncEngineArgs fields that turn the bounded session KV on (besides the payload's
    `sink_window` section, which the scheduler hook and the attention backend read)."""
    return {
        "hf_overrides": {
            "layer_types": ["sliding_attention"] * num_layers,
            "sliding_window": params.window_tokens + 1,
        },
        "worker_extension_cls": "services.extensions.vllm.sink_window_worker.SinkWindowWorker",
        # A cache hit would need the sink blocks and the window blocks both cached; vLLM's
        # sliding-window hit search knows no sinks.
        "enable_prefix_caching": False,
    }


def resident_blocks(length: int, block: int, sinks: int, window: int) -> list[int]:
    """Block indices a request of `length` computed tokens keeps: the sink blocks, then every block
    from the one holding the next query's window start (position length − W) on. This is what
    `SinkWindowManager` leaves allocated once `length` tokens are processed."""
    n_sink = min(cdiv(sinks, block), cdiv(length, block))
    first = max(n_sink, max(length - window, 0) // block)
    return list(range(n_sink)) + list(range(first, cdiv(length, block)))


def max_resident_blocks(block: int, sinks: int, window: int) -> int:
    """The bound resident blocks never exceed (any length)."""
    return cdiv(sinks, block) + cdiv(window, block) + 1


# -- scheduler side --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SinkWindowSpec(SlidingWindowSpec):
    sink_tokens: int = 0

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        bound = super().max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
        return min(bound + cdiv(self.sink_tokens, self.block_size), cdiv(max_model_len, self.block_size) + 1)


class SinkWindowManager(SlidingWindowManager):
    """vLLM's sliding-window manager keeping the sink blocks: blocks behind the window are freed
    from the first non-sink block on."""

    def __init__(self, kv_cache_spec: SinkWindowSpec, **kwargs) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.sink_blocks = cdiv(kv_cache_spec.sink_tokens, self.block_size)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        skipped = self.get_num_skipped_tokens(processed_computed_tokens) // self.block_size
        self._remove_blocks_in_range(request_id, self.sink_blocks, skipped)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, *args, **kwargs):
        # No prefix hits (engine_args turns prefix caching off; this keeps it so if it is forced on).
        return tuple([] for _ in kv_cache_group_ids), 0


def _register() -> None:
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    # The registry fills itself with vLLM's specs only while it is empty: fill it first.
    KVCacheSpecRegistry._ensure_registered()
    KVCacheSpecRegistry.register(SinkWindowSpec, SinkWindowManager, uniform_type_base_spec=SlidingWindowSpec)


def bounded(kv_cache_config, params: SinkWindowParams):
    """The KV cache config with its sliding-window groups as sink + window groups."""
    _register()
    groups = []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if type(spec) is SlidingWindowSpec:
            fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
            spec = SinkWindowSpec(**fields, sink_tokens=params.sink_tokens)
            group = dataclasses.replace(group, kv_cache_spec=spec)
        groups.append(group)
    return dataclasses.replace(kv_cache_config, kv_cache_groups=groups)


class SinkWindowKv:
    """The scheduler hook: the engine's KV cache config with sink + window groups."""

    def __init__(self, params: SinkWindowParams):
        self.params = params

    def kv_cache_config(self, config, vllm_config):
        return bounded(config, self.params)

    def before(self, scheduler) -> list:
        return []

    def after(self, scheduler, output, held: list) -> None:
        pass


# -- worker side -----------------------------------------------------------------------------


# CPU attention ISAs whose cache layout the kernels read (checked in tests/unit/engine/test_sink_window.py
# against vLLM's own cache write).
_TRANSPOSED_K_ISAS = ("vec", "vec16")


def cpu_cache_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of vLLM's CPU cache as the kernels read them, [blocks, block, kv_heads, head] (views,
    no copy). The cache is [blocks, kv_heads, block, 2 * head]: per (block, kv head) the K area then
    the V area; the vec ISAs store K transposed ([head, block]) and V as [block, head]."""
    blocks, kv_heads, block, _ = kv_cache.shape
    k_area, v_area = kv_cache.view(blocks, kv_heads, 2 * block, -1).chunk(2, dim=2)
    head = k_area.shape[-1]
    return k_area.view(blocks, kv_heads, head, block).permute(0, 3, 1, 2), v_area.transpose(1, 2)


class SinkWindowImpl(CPUAttentionBackendImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        params = EnginePayload.of(get_current_vllm_config()).sink_window
        bounded_layer = params and self.sliding_window > 0 and self.attn_type == AttentionType.DECODER
        self.mask = (params.sink_tokens, params.window_tokens) if bounded_layer else None

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        if self.mask is None or attn_metadata is None:
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        if layer.isa not in _TRANSPOSED_K_ISAS:
            raise NotImplementedError(
                f"bounded session KV: CPU attention ISA {layer.isa!r} (its KV layout) is not supported"
            )
        n = attn_metadata.num_actual_tokens
        k_cache, v_cache = cpu_cache_views(kv_cache)
        sinks, window = self.mask
        out = sink_attention.prefill(
            query[:n],
            k_cache,
            v_cache,
            attn_metadata.block_table,
            attn_metadata.query_start_loc,
            attn_metadata.seq_lens,
            sinks,
            window,
            self.scale,
        )
        output[:n].copy_(out.reshape(output[:n].shape))
        return output


class SinkWindowBackend(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[SinkWindowImpl]:
        return SinkWindowImpl
