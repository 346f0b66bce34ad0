"""`make models`: build or fetch every model a profile serves into $OMNIRAY_DATA/models.

Each model directory gets a manifest of file checksums when it is complete; a later run verifies
it and does nothing, so the command is cheap to repeat and a half-written build is redone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from services.models.profile import ModelSpec, load_profile
from services.models.registry import adapter_module

MANIFEST = "omniray_manifest.json"


def _checksums(root: Path) -> dict[str, str]:
    sums = {}
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.name != MANIFEST:
            sums[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return sums


def _recipe(spec: ModelSpec) -> str:
    """What a built model was built from: an adapter that builds weights itself says (its builder's
    version and options), so a changed builder rebuilds instead of serving stale weights."""
    recipe = getattr(adapter_module(spec.adapter), "recipe", None)
    return recipe(spec.options) if recipe is not None else ""


def is_prepared(path: Path, recipe: str = "") -> bool:
    manifest = path / MANIFEST
    if not manifest.exists():
        return False
    built = json.loads(manifest.read_text())
    return built.get("recipe", "") == recipe and built["files"] == _checksums(path)


def prepare(spec: ModelSpec, path: Path) -> bool:
    """Returns True when something was built."""
    if Path(spec.path).is_absolute():  # provided by the deployment (a mounted volume): check only
        adapter_module(spec.adapter).verify(path, spec.options)
        return False
    recipe = _recipe(spec)
    if is_prepared(path, recipe):
        return False
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    adapter_module(spec.adapter).prepare(tmp, spec.options)
    manifest = {"adapter": spec.adapter, "recipe": recipe, "files": _checksums(tmp)}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="tiny")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    owners: dict[Path, str] = {}  # a directory several roles read (one checkpoint) is built once
    for role, spec in profile.models:
        if spec is None:
            continue
        path = profile.model_path(spec)
        if path in owners:
            print(
                f"[models] {profile.name}/{role:8s} {spec.adapter:14s} the {owners[path]}'s: {path}",
                flush=True,
            )
            continue
        owners[path] = role
        t0 = time.monotonic()
        built = prepare(spec, path)
        state = f"built in {time.monotonic() - t0:.1f}s" if built else "ok"
        print(f"[models] {profile.name}/{role:8s} {spec.adapter:14s} {state}: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
