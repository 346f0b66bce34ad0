"""Deploy profiles derived from configs/ for one benchmark run (written to its temporary directory)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from services.models import build
from services.models.profile import CONFIG_DIR


def derive(base: str, tmp: Path, name: str, edit: Callable[[dict], None]) -> Path:
    """configs/<base>.yaml changed by `edit`, saved as <tmp>/<name>.yaml; its models are built."""
    data = yaml.safe_load((CONFIG_DIR / f"{base}.yaml").read_text())
    edit(data)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    build.main(["--profile", str(path)])
    return path


def widen_thinker(data: dict, hidden: int, layers: int) -> None:
    """A tiny-style thinker (random Llama, built locally) at `hidden` x `layers`, so prefill and
    decode cost what a model of that size costs here; the encoders project into its width."""
    thinker = data["models"]["thinker"]
    thinker["path"] = f"bench/thinker-{hidden}x{layers}"
    thinker["options"] = {**thinker.get("options", {}), "hidden_size": hidden, "num_layers": layers}
    for role in ("vision", "audio"):
        if data["models"].get(role):
            data["models"][role]["path"] = f"bench/{role}-{hidden}"
