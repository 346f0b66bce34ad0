"""compat.torchvision_free.py, in fresh interpreters (it acts at start-up,
from the `.pth` line `make setup` writes): vLLM's Qwen3-Omni thinker imports without torchvision, and
without the alias it still would not — when that changes upstream, the alias goes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from services.common.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is not None,
    reason="torchvision is installed: nothing to stand in for",
)
THINKER = "vllm.model_executor.models.qwen3_omni_moe_thinker"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )


def test_vllms_qwen3_omni_thinker_imports_without_torchvision():
    run = _python(
        f"import {THINKER}, sys\n"
        "m = sys.modules['transformers.models.qwen2_vl.image_processing_qwen2_vl']\n"
        "assert m.__name__.endswith('image_processing_pil_qwen2_vl'), m.__name__\n"
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_without_the_alias_it_does_not():
    run = _python(
        "import sys\n"
        "sys.meta_path = [f for f in sys.meta_path if type(f).__module__ != "
        "'compat.torchvision_free']\n"
        f"import {THINKER}\n"
    )
    assert run.returncode != 0 and "No module named 'torchvision'" in run.stderr, run.stderr[-2000:]
