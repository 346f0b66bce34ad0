"""Where benchmark runs leave their raw figures: loadtest/results/<kind>-<profile>-<time>.json
(not committed; docs/benchmarks.md records the figures with the command that produced them)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from services.models.profile import REPO_ROOT

RESULTS = REPO_ROOT / "loadtest" / "results"


def write(kind: str, profile: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{kind}-{profile}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(data, indent=1))
    return path
