"""A Hugging Face checkpoint that the deployment provides on a volume (GPU clusters: a PVC or a
hostPath with tens of GB of weights). Profiles give it an absolute `path`; `make models` only
verifies it, never downloads, copies or hashes it. vLLM serves it as the thinker."""

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
