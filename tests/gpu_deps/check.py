"""`make test-gpu-deps`, run by the GPU dependency set's own interpreter (a throwaway venv of
pyproject.toml's `gpu` extra under constraints-gpu.txt: CUDA vLLM and torch, NIXL; no device needed):
every engine extension and every adapter of the `qwen3-omni` profile imports from it, each against
the vLLM release it was written for; vLLM resolves the thinker architecture omniray registers; and
the Qwen3-Omni stage models load and run on that torch (`qwen3-omni-tiny`'s checkpoint, on the CPU:
the talker writes frames, code2wav decodes them).
On a machine without a GPU this is as far as the GPU profile goes; a GPU node runs `make bench-omni
PROFILE=qwen3-omni` (docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import pkgutil
import sys


def main() -> int:
    import torch
    import vllm

    import services.extensions.vllm as extensions
    from services.extensions.vllm import pins, plugin
    from services.models.profile import load_profile
    from services.models.registry import adapter_module

    if not torch.version.cuda:
        print(f"torch {torch.__version__} is not a CUDA build", file=sys.stderr)
        return 1
    names = sorted(f"{extensions.__name__}.{m.name}" for m in pkgutil.iter_modules(extensions.__path__))
    for name in names:  # each calls pins.check when it touches vLLM internals
        importlib.import_module(name)
    profile = load_profile("qwen3-omni")
    adapters = {
        role: getattr(profile.models, role) for role in ("thinker", "vision", "audio", "talker", "vocoder")
    }
    for spec in adapters.values():
        adapter_module(spec.adapter)
    importlib.import_module("services.engine.thinker")
    plugin.register()
    _speak(load_profile("qwen3-omni-tiny"))
    from vllm import ModelRegistry

    if plugin.QWEN3_OMNI_THINKER not in ModelRegistry.get_supported_archs():
        print(f"vLLM does not list {plugin.QWEN3_OMNI_THINKER}", file=sys.stderr)
        return 1
    print(
        f"[test-gpu-deps] vLLM {vllm.__version__} (extensions written for {pins.WRITTEN_FOR}), torch "
        f"{torch.__version__} (CUDA {torch.version.cuda}): {len(names)} engine extensions and the "
        f"qwen3-omni adapters {sorted({s.adapter for s in adapters.values()})} import"
    )
    return 0


def _speak(profile) -> None:
    """The tiny checkpoint's talker writes a few frames for a text prompt; code2wav decodes them."""
    import numpy as np

    from services.models.base import ThinkerPrompt
    from services.models.registry import adapter_module

    models = profile.models
    talker = adapter_module(models.talker.adapter).load(
        profile.model_path(models.talker), models.talker.options
    )
    vocoder = adapter_module(models.vocoder.adapter).load(
        profile.model_path(models.vocoder), models.vocoder.options
    )
    c = talker.config
    prompt = [c.im_start_token_id, c.user_token_id, 100, 200, c.im_end_token_id, c.im_start_token_id,
              c.assistant_token_id, 198]  # fmt: skip
    stream = talker.stream(ThinkerPrompt(prompt), profile.pipeline.default_voice, seed=0)
    stream.feed([300, 400, c.im_end_token_id])
    stream.finish()
    frames = np.concatenate(list(stream.frames(timeout=60)))
    wave = vocoder.decode(frames, None, None, profile.pipeline.default_voice)
    assert frames.shape[1] == 16 and len(wave) > 0 and np.isfinite(wave).all(), (frames.shape, wave.shape)


if __name__ == "__main__":
    raise SystemExit(main())
