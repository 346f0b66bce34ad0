"""Save/load the tiny torch modules' random weights (seeded, so every machine builds the same)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from services.models.options import TinyEncoder


def save(module: torch.nn.Module, dest: Path, config: dict) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))


def load(cls, path: Path) -> tuple[torch.nn.Module, dict]:
    config = json.loads((path / "config.json").read_text())
    module = cls(**config["arch"])
    module.load_state_dict(load_file(str(path / "model.safetensors")))
    return module.eval(), config


def thinker_hidden_size(options: TinyEncoder) -> int:
    """Encoders project into the thinker's embedding space; its width comes from the thinker."""
    if options.thinker_hidden_size is None:
        raise ValueError(
            "a tiny encoder needs thinker_hidden_size (given, or the tiny thinker's hidden_size)"
        )
    return options.thinker_hidden_size
