"""torch.compile over static shapes, for the speech stages' GPU paths (the profile's `compile`).

A batch is padded to a bucket (1, 2, 4, ...) so that a handful of shapes covers every batch size; on a
GPU each shape is a CUDA graph (`mode="reduce-overhead"`: captured on first use, replayed after),
which removes the per-kernel launch cost that dominates a small model's step. On a CPU the same code
runs through inductor (or any backend a test names), so the path is exercised without a GPU.
"""

from __future__ import annotations

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket(rows: int) -> int:
    """The smallest bucket that holds `rows`."""
    return next(b for b in BUCKETS if b >= rows)


def compiled(fn, backend: str, graphs: int):
    """`fn` through torch.compile with static shapes; room for `graphs` of them before dynamo would
    fall back to eager (its default allows 8 per function)."""
    import torch

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs)
    mode = "reduce-overhead" if torch.cuda.is_available() else None
    return torch.compile(fn, backend=backend, dynamic=False, mode=mode)
