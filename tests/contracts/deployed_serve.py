"""A contract scenario run on Ray Serve as omniray deploys it: Serve's throughput-optimized mode
(services/app.py SERVE_ENV: gRPC between replicas, each router on its caller's event loop). Serve
reads its mode when it is imported, so a scenario runs in a Python process of its own: an async
function of a test module, given `serve` (started on a local Ray of that process), whose JSON-able
result comes back to the test."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from services.app import SERVE_ENV

RESULT = "scenario result: "


def run(test_file: str, scenario: str, timeout_s: float = 240) -> Any:
    """`scenario` of the module at `test_file` in deployed Serve; its result."""
    done = subprocess.run(
        [sys.executable, __file__, test_file, scenario],
        env={**os.environ, **SERVE_ENV},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    results = [line[len(RESULT) :] for line in done.stdout.splitlines() if line.startswith(RESULT)]
    assert done.returncode == 0 and results, done.stderr[-6000:]
    return json.loads(results[-1])


def _main(test_file: str, scenario: str) -> None:
    import ray
    from ray import serve

    path = Path(test_file)
    sys.path.insert(0, str(path.parent))  # replicas import the module's deployments by its name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(proxy_location="Disabled")
        result = asyncio.run(getattr(module, scenario)(serve))
    finally:
        ray.shutdown()
    print(RESULT + json.dumps(result), flush=True)


if __name__ == "__main__":
    _main(*sys.argv[1:])
