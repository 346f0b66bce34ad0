"""Triton kernels run under the interpreter on CPU. Triton chooses at decoration time, so the kernel
modules are imported here with TRITON_INTERPRET=1 and the variable is set again around each kernel
test, but put back otherwise: engine processes that other tests start must not inherit it."""

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for module in ("kernels.triton_sink_attention", "kernels.triton_kv_pages"):
            importlib.import_module(module)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    """Launches check the variable too: set for the duration of each kernel test only."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
