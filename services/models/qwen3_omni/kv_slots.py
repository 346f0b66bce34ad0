"""The talker's per-stream KV in one pool of slots, and the transformers `Cache` a batched step
attends through.

Each layer holds keys and values as [slots, kv_heads, capacity, head_dim]: a stream owns a slot from
its prefill to its end, its tokens at positions 0..length-1 of it. A step over some of the streams
writes each one's new token at its own length and attends over the first `max(length) + 1`
positions of their slots; a stream shorter than that masks the rest (`mask`). The pool grows
(doubling its capacity) when a stream would outgrow it, so nothing is allocated per step.

transformers' attention layers call `Cache.update(keys, values, layer)` and attend over what it
returns: `StepCache` is that cache for one step (rows = the step's slots, in step order).
"""

from __future__ import annotations

from transformers.cache_utils import Cache, CacheLayerMixin

INITIAL_CAPACITY = 256


class KvSlots:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, slots: int, device, dtype):
        import torch

        self.shape = (slots, kv_heads, INITIAL_CAPACITY, head_dim)
        self.keys = [torch.zeros(self.shape, device=device, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(self.shape, device=device, dtype=dtype) for _ in range(layers)]
        self.free = list(range(slots))  # lowest first: a steady batch keeps slots 0..n-1 (a view, no gather)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def claim(self) -> int:
        if not self.free:
            raise RuntimeError("no free talker slot")  # the loop admits at most `slots` streams
        self.free.sort()
        return self.free.pop(0)

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def reserve(self, length: int) -> None:
        """Room for `length` positions in every slot (the pool doubles until it fits)."""
        capacity = self.capacity
        while capacity < length:
            capacity *= 2
        if capacity == self.capacity:
            return
        for pool in (self.keys, self.values):
            for i, old in enumerate(pool):
                grown = old.new_zeros((old.shape[0], old.shape[1], capacity, old.shape[3]))
                grown[:, :, : old.shape[2]] = old
                pool[i] = grown

    def store(self, slot: int, cache: Cache) -> None:
        """A prefill's DynamicCache (one row) into `slot`."""
        length = cache.get_seq_length()
        self.reserve(length + 1)
        for i, layer in enumerate(cache.layers):
            self.keys[i][slot, :, :length] = layer.keys[0]
            self.values[i][slot, :, :length] = layer.values[0]

    def step(self, slots: list[int], lengths: list[int]) -> StepCache:
        """The cache of one step: row r writes at `lengths[r]` of `slots[r]`; all attend over the first
        max(lengths) + 1 positions."""
        import torch

        self.reserve(max(lengths) + 1)
        device = self.keys[0].device
        contiguous = slots == list(range(len(slots)))
        rows = torch.tensor(slots, device=device)
        at = torch.tensor(lengths, device=device)
        return StepCache(
            [_StepLayer(self, i, rows, at, max(lengths), contiguous) for i in range(len(self.keys))]
        )

    def mask(self, lengths: list[int], attention: str, dtype):
        """None where every row has the same length (the plain causal decode); else [rows, 1, 1, L]
        over the step's positions, each row seeing its own length + 1 (sdpa: bool, eager: additive)."""
        import torch

        if len(set(lengths)) == 1:
            return None
        if attention not in ("sdpa", "eager"):
            raise ValueError(f"a batched talker step needs sdpa or eager attention, not {attention}")
        device = self.keys[0].device
        width = max(lengths) + 1
        seen = torch.arange(width, device=device)[None, :] <= torch.tensor(lengths, device=device)[:, None]
        if attention == "sdpa":
            return seen[:, None, None, :]
        return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill(~seen, torch.finfo(dtype).min)[
            :, None, None, :
        ]


class _StepLayer(CacheLayerMixin):
    """One layer of a step: writes the step's new token of each row into its slot, returns the rows'
    keys/values over the step's positions (a view of the pool when the rows are slots 0..n-1)."""

    def __init__(self, pool: KvSlots, layer: int, rows, at, past: int, contiguous: bool):
        super().__init__()
        self.pool, self.layer, self.rows, self.at, self.past = pool, layer, rows, at, past
        self.contiguous = contiguous
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # the pool is allocated up front
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = self.pool.keys[self.layer], self.pool.values[self.layer]
        keys[self.rows, :, self.at] = key_states[:, :, 0]
        values[self.rows, :, self.at] = value_states[:, :, 0]
        width = self.past + 1
        if self.contiguous:
            n = len(self.rows)
            return keys[:n, :, :width], values[:n, :, :width]
        return keys[self.rows, :, :width], values[self.rows, :, :width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.past + query_length, 0

    def get_seq_length(self) -> int:
        return self.past

    def get_max_length(self) -> int:
        return -1


class StepCache(Cache):
    def __init__(self, layers: list[_StepLayer]):
        super().__init__(layers=layers)
