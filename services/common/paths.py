"""Where the repository and the data directory are (models, KV pages, runs)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    return Path(os.environ.get("OMNIRAY_DATA", REPO_ROOT / ".data")).resolve()
