"""Running Triton kernels on CPU through Triton's interpreter, in a test process that also runs
engines. Triton honours TRITON_INTERPRET=1 only when it is set as triton is first imported, again when
a kernel is decorated, and again when it is launched; engine processes must never inherit it."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator

import torch

KERNEL_MODULES = ("kernels.triton_sink_attention", "kernels.triton_kv_pages")


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    if torch.cuda.is_available():
        yield
        return
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def import_triton_for_interpreter() -> None:
    """Import triton and decorate the kernels with the interpreter on (a no-op on a GPU host)."""
    with interpreting():
        importlib.import_module("triton")
        for module in KERNEL_MODULES:
            importlib.import_module(module)
