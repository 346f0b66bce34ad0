"""Version skew: the vision model is updated on disk under a running encoder replica (v1 in memory)
and a gateway starts that expects v2. Features from v1 are rejected, counted, re-encoded at v2 (the
replica reloads the model now on disk), and the request succeeds."""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.request

import httpx
import pytest

from services import runtime
from services.common.paths import data_dir
from services.models.build import MANIFEST, prepare
from services.models.profile import load_profile
from tests.conftest import AUTH, data_url, local_cluster, png_bytes


def _mismatches(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    found = re.findall(
        r"^ray_omniray_encoder_feature_version_mismatch_total\{[^}]*\} ([0-9.e+]+)$", text, re.M
    )
    return sum(float(x) for x in found)


@pytest.fixture
def private_data(tmp_path, monkeypatch):
    """A copy of the tiny models this test may change, without touching the shared ones."""
    shutil.copytree(data_dir() / "models" / "tiny", tmp_path / "models" / "tiny")
    monkeypatch.setenv("OMNIRAY_DATA", str(tmp_path))
    return tmp_path


def test_stale_encoder_features_are_rejected_reencoded_counted(private_data):
    profile = load_profile("tiny")
    spec = profile.models.vision
    with local_cluster("tiny") as cluster:

        def ask(seed: int) -> httpx.Response:
            image = {"type": "image_url", "image_url": {"url": data_url(png_bytes(128, 128, seed=seed))}}
            body = {
                "model": "omniray-tiny",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": [image]}],
            }
            return httpx.post(f"{cluster.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)

        assert ask(1).status_code == 200
        # v2 of the vision model lands on disk; the running encoder replica still serves v1.
        path = profile.model_path(spec)
        (path / MANIFEST).unlink()
        v2 = spec.model_copy(update={"options": spec.options.model_copy(update={"seed": 99})})
        assert prepare(v2, path)
        # Only the gateway restarts (its options changed) and now expects v2.
        runtime.deploy(
            cluster, "tiny", stage_overrides={"gateway": {"ray_actor_options": {"num_cpus": 0.11}}}
        )
        before = _mismatches(cluster.metrics_url)
        r = ask(2)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60  # Ray exports metrics every few seconds
        while _mismatches(cluster.metrics_url) <= before and time.monotonic() < deadline:
            time.sleep(2)
        assert _mismatches(cluster.metrics_url) == before + 1
        # The replica now serves v2: no further mismatch.
        assert ask(3).status_code == 200
        time.sleep(8)
        assert _mismatches(cluster.metrics_url) == before + 1
    assert os.environ["OMNIRAY_DATA"] == str(private_data)
