"""The Qwen3-Omni checkpoint that every Qwen3-Omni adapter reads: the thinker's directory (built by
hf_checkpoint, or mounted). Each adapter loads only its own tensors from it."""

from __future__ import annotations

import json
from pathlib import Path


def tensors(path: Path, prefix: str) -> dict:
    """The checkpoint's tensors under `prefix`, named without it."""
    from safetensors import safe_open

    state = {}
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            names = [k for k in f.keys() if k.startswith(prefix)]  # noqa: SIM118 (safe_open is not iterable)
            state |= {k.removeprefix(prefix): f.get_tensor(k) for k in names}
    return state


def fused_experts(state: dict) -> dict:
    """Per-expert MoE weights as checkpoints store them (`experts.{i}.gate_proj/up_proj/down_proj`)
    -> the stacked tensors transformers' modules hold (`experts.gate_up_proj` [E, 2I, H] with gate
    rows first, `experts.down_proj` [E, H, I]): what `from_pretrained` converts on load."""
    import re

    import torch

    pattern = re.compile(r"^(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out = {}
    for name, tensor in state.items():
        if m := pattern.match(name):
            experts.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = tensor
        else:
            out[name] = tensor
    for prefix, by_index in experts.items():
        ordered = [by_index[i] for i in sorted(by_index)]
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([e["gate"], e["up"]]) for e in ordered])
        out[f"{prefix}.down_proj"] = torch.stack([e["down"] for e in ordered])
    return out


def token_ids(path: Path, *tokens: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return [tokenizer.convert_tokens_to_ids(t) for t in tokens]


def verify(path: Path, part: str) -> None:
    """`part`: the config key of the module an adapter loads (thinker_config, code2wav_config)."""
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (config.json missing)")
    if part not in json.loads(config.read_text()):
        raise ValueError(f"{path} has no {part} (not a Qwen3-Omni checkpoint with that part)")


def prepare(dest: Path) -> None:
    raise ValueError(
        f"{dest}: Qwen3-Omni's parts read the thinker's checkpoint; give them the thinker's path "
        "(hf_checkpoint, listed first, builds it)"
    )


def module(cls, config, path: Path, prefix: str, dtype: str = "float32"):
    """transformers' `cls` built from `config` with the checkpoint's `prefix` tensors (per-expert MoE
    weights stacked), in `dtype`, on the process's GPU if it has one (a GPU replica), else the CPU."""
    import torch

    model = cls._from_config(config)
    model.load_state_dict(fused_experts(tensors(path, prefix)), strict=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()
