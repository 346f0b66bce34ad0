"""Page layout: how one page of KV cache is laid out in bytes, for any model.

A page holds `page_tokens` tokens for every layer: layer x K/V x [page_tokens, kv_heads, head_dim].
Models with one latent per token instead of K and V (MLA) set `kv_parts=1`. No model-specific cases:
everything derives from these numbers (`from_hf_config` reads them from a Hugging Face config).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1}


@dataclass(frozen=True)
class PageLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_tokens: int
    dtype: str = "float16"
    kv_parts: int = 2

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r}; one of {sorted(_DTYPES)}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_tokens", "kv_parts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def itemsize(self) -> int:
        return _DTYPES[self.dtype]

    @property
    def slice_bytes(self) -> int:
        """One layer's K (or V) for the page's tokens."""
        return self.page_tokens * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def page_bytes(self) -> int:
        return self.num_layers * self.kv_parts * self.slice_bytes

    def offset(self, layer: int, part: int) -> int:
        """Byte offset of (layer, K=0 / V=1) inside a page."""
        if not (0 <= layer < self.num_layers and 0 <= part < self.kv_parts):
            raise IndexError((layer, part))
        return (layer * self.kv_parts + part) * self.slice_bytes

    def view(self, page: np.ndarray) -> np.ndarray:
        """A page's bytes as [layers, kv_parts, page_tokens, kv_heads, head_dim] (no copy)."""
        if page.nbytes != self.page_bytes:
            raise ValueError(f"page has {page.nbytes} bytes, layout needs {self.page_bytes}")
        dt = np.float16 if self.itemsize == 2 else np.float32 if self.itemsize == 4 else np.uint8
        shape = (self.num_layers, self.kv_parts, self.page_tokens, self.num_kv_heads, self.head_dim)
        return page.view(dt).reshape(shape)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_tokens)

    @classmethod
    def from_hf_config(cls, config: dict, page_tokens: int, dtype: str = "float16") -> PageLayout:
        heads = config["num_attention_heads"]
        return cls(
            num_layers=config["num_hidden_layers"],
            num_kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            page_tokens=page_tokens,
            dtype=dtype,
        )
