"""Where benchmark runs leave their raw figures: loadtest/results/<kind>-<profile>-<time>.json
(not committed; docs/benchmarks.md records the figures with the command that produced them)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

from services.common.paths import REPO_ROOT

RESULTS = REPO_ROOT / "loadtest" / "results"


def write(kind: str, profile: str | None, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "-".join(x for x in (kind, profile, time.strftime("%Y%m%d-%H%M%S")) if x)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def header(profile: str, **settings) -> dict:
    """What a report starts with: the profile, the run's settings, the machine, the commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    return {
        "profile": profile,
        **settings,
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "commit": commit.stdout.strip(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
