"""Fixtures the contract tests share."""

from __future__ import annotations

import pytest
import ray


@pytest.fixture(scope="module")
def serve_up():
    """Ray Serve on a local Ray of this process (started here unless one is up), shut down after
    the module."""
    from ray import serve

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield serve
    serve.shutdown()
    if started:
        ray.shutdown()
