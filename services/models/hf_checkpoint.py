"""A Hugging Face checkpoint that the deployment provides on a volume (GPU clusters: a PVC or a
hostPath with tens of GB of weights). Profiles give it an absolute `path`; `make models` only
verifies it, never downloads, copies or hashes it. vLLM serves it as the thinker.

The same checkpoint at a tiny size with random weights (`options.random_init`, a path under
$OMNIRAY_DATA/models) is built by `make models` instead, so a CPU profile runs the GPU profile's
model code (services/models/qwen3_omni/random_checkpoint.py)."""

from __future__ import annotations

import json
from pathlib import Path

from services.models import options as o


def verify(path: Path, options: o.HfCheckpoint) -> None:
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (config.json missing): mount the weights there")
    if not any(path.glob("*.safetensors")):
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    expected = options.architecture
    found = json.loads(config.read_text()).get("architectures", [])
    if expected and expected not in found:
        raise ValueError(f"{path} is a {found} checkpoint, the profile expects {expected}")


def recipe(options: o.HfCheckpoint) -> str:
    if options.random_init is None:
        return ""
    from services.models.qwen3_omni import random_checkpoint

    return f"{random_checkpoint.BUILDER_VERSION}:{options.random_init.model_dump_json()}"


def prepare(dest: Path, options: o.HfCheckpoint) -> None:
    if options.random_init is None:
        raise ValueError(
            "a checkpoint under $OMNIRAY_DATA needs options.random_init; mount real weights at an absolute path"
        )
    from services.models.qwen3_omni import random_checkpoint

    random_checkpoint.build(dest, options.random_init)
