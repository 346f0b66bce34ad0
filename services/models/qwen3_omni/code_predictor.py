"""Qwen3-Omni's code predictor, for a batch of talker streams at once: per frame, the 15 residual
codes after the talker's code, each stream's drawn as transformers' `generate` draws them (greedy or
top-k 50 / top-p 0.8, from the stream's own generator), without `generate`.

Every stream of a frame is at the same position (the predictor starts over on each frame: the
talker's hidden state and the code's embedding, then one code per step), so the batch needs no
padding. Keys and values go to a cache allocated once per batch size (positions 0..15 of every row)
and the steps read views of it: no allocation per step, no logits-processor objects, no
`generate` bookkeeping — on a CPU the predictor's 15 forwards per frame are most of a frame.

The codes' embeddings, summed, are the talker's next input (as transformers' talker sums the
predictor's input embeddings).

Compiled (`compile`, the GPU profile): the predictor's forward through `torch.compile` — on a GPU with
CUDA graphs (`mode="reduce-overhead"`) — over static shapes: the batch padded to a bucket (1, 2, 4, ...),
every frame position in the cache, the positions and the causal mask as tensors, so each bucket is
two graphs (the frame's first step, then the rest), captured once. Its draws are the same; its
numbers are the compiled kernels', not bit-equal to transformers' eager ones.
"""

from __future__ import annotations

from transformers.cache_utils import Cache, CacheLayerMixin

from services.models.compiled import BUCKETS, bucket, compiled
from services.models.qwen3_omni import sampling


class _Layer(CacheLayerMixin):
    def __init__(self, keys, values):
        super().__init__()
        self.keys, self.values = keys, values  # [rows, heads, positions, dim], allocated once
        self.length = 0
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[2]
        self.keys[:, :, self.length : self.length + n] = key_states
        self.values[:, :, self.length : self.length + n] = value_states
        self.length += n
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class _FrameCache(Cache):
    def __init__(self, layers: list[_Layer]):
        super().__init__(layers=layers)

    def rewind(self) -> None:
        for layer in self.layers:
            layer.length = 0


class _StaticLayer(CacheLayerMixin):
    """The compiled path's layer: writes at the positions `at` holds, attends over all of them (the
    mask hides the ones not written yet): one shape for every step."""

    def __init__(self, keys, values, at):
        super().__init__()
        self.keys, self.values, self.at = keys, values, at
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys.index_copy_(2, self.at[: key_states.shape[2]], key_states)
        self.values.index_copy_(2, self.at[: key_states.shape[2]], value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class CodePredictor:
    def __init__(self, predictor, codebooks: int, compile: str | None = None):
        """`compile`: None (eager, exact), or torch.compile's backend ("inductor"; tests trace with
        "aot_eager"), in mode "reduce-overhead" on a GPU (CUDA graphs per bucket)."""
        self.model = predictor  # transformers' Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration
        self.codebooks = codebooks
        self._caches: dict[int, _FrameCache] = {}
        self._static: dict[int, tuple] = {}
        self._compiled = None
        if compile is not None:
            self._compiled = compiled(predictor.model, compile, graphs=2 * len(BUCKETS))

    def _cache(self, rows: int) -> _FrameCache:
        """The frame cache for `rows` streams, rewound (made on first use of that batch size)."""
        import torch

        cache = self._caches.get(rows)
        if cache is None:
            c = self.model.config
            p = next(self.model.parameters())
            shape = (rows, c.num_key_value_heads, self.codebooks, c.head_dim)
            cache = self._caches[rows] = _FrameCache(
                [
                    _Layer(
                        torch.zeros(shape, device=p.device, dtype=p.dtype),
                        torch.zeros(shape, device=p.device, dtype=p.dtype),
                    )
                    for _ in range(c.num_hidden_layers)
                ]
            )
        cache.rewind()
        return cache

    def __call__(self, past_hidden, code_embeds, sample: list[bool], generators: list):
        """`past_hidden` [rows, 1, h]: the talker's last hidden state; `code_embeds` [rows, 1, h]: its
        code's embedding. Returns the 15 codes [rows, 15] and the frame's embeddings [rows, 16, h]."""
        if self._compiled is not None:
            return self._static_frame(past_hidden, code_embeds, sample, generators)
        return self._frame(past_hidden, code_embeds, sample, generators)

    def _frame(self, past_hidden, code_embeds, sample: list[bool], generators: list):
        import torch

        inner, heads = self.model.model, self.model.lm_head
        embeddings = inner.get_input_embeddings()
        cache = self._cache(past_hidden.shape[0])
        embeds = torch.cat((past_hidden, code_embeds), dim=1)
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        codes, frame = [], [code_embeds]
        for step in range(self.codebooks - 1):
            hidden = inner(inputs_embeds=embeds, attention_mask=mask, past_key_values=cache, use_cache=True)
            logits = heads[step](hidden.last_hidden_state)[:, -1].float()
            code = sampling.predictor_codes(logits, sample, generators)
            codes.append(code)
            embeds = embeddings[step](code[:, None])
            frame.append(embeds)
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        return torch.stack(codes, dim=1), torch.cat(frame, dim=1)

    def _static_frame(self, past_hidden, code_embeds, sample: list[bool], generators: list):
        """The compiled path: rows padded to their bucket, static shapes."""
        import torch

        rows = past_hidden.shape[0]
        size = bucket(rows)
        cache, at, masks = self._static_cache(size)
        heads, embeddings = self.model.lm_head, self.model.model.get_input_embeddings()
        embeds = past_hidden.new_zeros((size, 2, past_hidden.shape[-1]))
        embeds[:rows] = torch.cat((past_hidden, code_embeds), dim=1)
        codes, frame = [], [code_embeds]
        for step in range(self.codebooks - 1):
            q = embeds.shape[1]
            at[:q] = torch.arange(step + 2 - q, step + 2, device=at.device)  # the positions written now
            positions = at[:q].expand(size, q)
            hidden = self._compiled(
                inputs_embeds=embeds, attention_mask=masks[step], position_ids=positions, past_key_values=cache,
                use_cache=True,
            ).last_hidden_state  # fmt: skip
            logits = heads[step](hidden[:rows])[:, -1].float()
            code = sampling.predictor_codes(logits, sample, generators)
            codes.append(code)
            new = embeddings[step](code[:, None])
            frame.append(new)
            embeds = new.new_zeros((size, 1, new.shape[-1]))
            embeds[:rows] = new
        return torch.stack(codes, dim=1), torch.cat(frame, dim=1)

    def _static_cache(self, size: int):
        """A bucket's cache (every frame position), the positions its layers write at, and each
        step's causal mask [size, 1, q, positions] (made once)."""
        import torch

        if size not in self._static:
            c = self.model.config
            p = next(self.model.parameters())
            shape = (size, c.num_key_value_heads, self.codebooks, c.head_dim)
            at = torch.zeros(2, dtype=torch.long, device=p.device)
            layers = [
                _StaticLayer(torch.zeros(shape, device=p.device, dtype=p.dtype),
                             torch.zeros(shape, device=p.device, dtype=p.dtype), at)
                for _ in range(c.num_hidden_layers)
            ]  # fmt: skip
            seen = torch.arange(self.codebooks, device=p.device)
            masks = []
            for step in range(self.codebooks - 1):
                queries = torch.arange(step + 2 - (2 if step == 0 else 1), step + 2, device=p.device)
                masks.append((seen[None, :] <= queries[:, None]).expand(size, 1, -1, -1).contiguous())
            self._static[size] = (_FrameCache(layers), at, masks)
        return self._static[size]
