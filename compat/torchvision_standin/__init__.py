"""Puts a torchvision stand-in (`./torchvision`) on the import path where the real one is absent.

PyPI's torchvision is a CUDA build that breaks on CPU torch, so the CPU install removes it; but
vLLM's Qwen2-VL family (and so its Qwen3-Omni thinker) imports transformers' torchvision-backed
image processor, and transformers' Qwen3-Omni processor needs a video processor, which needs
torchvision. The stand-in has what transformers' image processors call (`transforms.v2.functional`
resize / pad / normalize / crop with torch ops, `io.decode_image` through PIL, `InterpolationMode`);
anything else (video decoding among it) raises NotImplementedError when called. Images only: the
Qwen3-Omni profiles take no video.

Imported by every process of the venv from a `.pth` line `make setup` writes (vLLM inspects models in
subprocesses). Appended to the path, so an installed torchvision (GPU images) always wins. Written for
transformers 5.19 / vLLM 0.32 (tests/contracts/test_torchvision_standin.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("torchvision") is None:
    sys.path.append(str(Path(__file__).parent))
