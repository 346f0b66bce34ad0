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
"""

from __future__ import annotations

from transformers.cache_utils import Cache, CacheLayerMixin

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


class CodePredictor:
    def __init__(self, predictor, codebooks: int):
        self.model = predictor  # transformers' Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration
        self.codebooks = codebooks
        self._caches: dict[int, _FrameCache] = {}

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
