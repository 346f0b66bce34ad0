"""Lets vLLM's Qwen2-VL family (and so its Qwen3-Omni thinker) import where torchvision is absent.

PyPI's torchvision is a CUDA build that breaks on CPU torch, so the CPU install removes it. Without it
transformers picks its PIL image processors, but vLLM 0.32's `qwen2_vl` still imports `smart_resize`
from transformers' torchvision-backed `image_processing_qwen2_vl`, whose first line imports
torchvision. Here that module name resolves to its PIL twin (the same `smart_resize`), only while
torchvision cannot be found; where it is installed (GPU images) nothing changes.

Activated at interpreter start in every process of the venv (a `.pth` line the Makefile writes), since
vLLM inspects model architectures in a subprocess. Written for transformers 5.19 / vLLM 0.32; gone
once vLLM imports `smart_resize` from a module without torchvision
(tests/contracts/test_torchvision_free.py)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

ALIASES = {
    "transformers.models.qwen2_vl.image_processing_qwen2_vl": (
        "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
    ),
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in ALIASES and importlib.util.find_spec("torchvision") is None:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(ALIASES[spec.name])

    def exec_module(self, module) -> None:
        pass  # the twin is loaded already


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())


install()
