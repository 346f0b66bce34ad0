"""The one writer of what load tests and benchmarks leave behind, under loadtest/results/ (not
committed; docs/benchmarks.md records the figures with the command that produced them): a run's
figures as <kind>-<profile>-<time>.json (`write`), or a run's own folder of files — Locust's CSVs and
plots, a soak's — with its summary.json and summary.md (`folder`, `write_summary`)."""

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


def folder(kind: str = "") -> Path:
    """A new folder for one run's files: loadtest/results/[<kind>-]<time>/."""
    out = RESULTS / "-".join(x for x in (kind, time.strftime("%Y%m%d-%H%M%S")) if x)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_summary(out: Path, summary: dict, markdown: str | None = None) -> Path:
    """A run folder's summary.json (and summary.md)."""
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=1))
    if markdown is not None:
        (out / "summary.md").write_text(markdown)
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
