"""compat/torchvision_standin, in fresh interpreters (it acts at start-up, from the `.pth` line
`make setup` writes): where torchvision is absent the stand-in is what `import torchvision` finds,
vLLM's Qwen3-Omni thinker imports, the tiny checkpoint's processor loads and turns an image into
patches; what it does not have raises when called, not when imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.common.paths import REPO_ROOT
from services.models.profile import load_profile


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )


@pytest.fixture(scope="module")
def standin():
    run = _python("import torchvision; print(torchvision.__file__)")
    assert run.returncode == 0, run.stderr[-2000:]
    if "torchvision_standin" not in run.stdout:
        pytest.skip("a real torchvision is installed: the stand-in stays off the path")


def test_vllms_qwen3_omni_thinker_imports(standin):
    run = _python("import vllm.model_executor.models.qwen3_omni_moe_thinker")
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_tiny_checkpoints_processor_turns_an_image_into_patches(standin):
    profile = load_profile("qwen3-omni-tiny")
    path = profile.model_path(profile.models.thinker)
    run = _python(
        "import sys, numpy as np\n"
        "from PIL import Image\n"
        "from transformers import AutoProcessor\n"
        f"p = AutoProcessor.from_pretrained({str(path)!r})\n"
        "image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (100, 140, 3), dtype=np.uint8))\n"
        "out = p.image_processor(images=[image], return_tensors='pt')\n"
        "t, h, w = out['image_grid_thw'][0].tolist()\n"
        "assert t == 1 and h % 2 == 0 and w % 2 == 0, (t, h, w)\n"
        "assert out['pixel_values'].shape == (t * h * w, 3 * 2 * 16 * 16), out['pixel_values'].shape\n"
        "print(type(p).__name__, type(p.video_processor).__name__)\n"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Qwen3OmniMoeProcessor Qwen2VLVideoProcessor" in run.stdout


def test_what_the_standin_lacks_fails_when_called(standin):
    run = _python(
        "from torchvision.io import read_video\n"
        "from torchvision.transforms.functional import to_pil_image\n"
        "try:\n"
        "    to_pil_image(None)\n"
        "except NotImplementedError as e:\n"
        "    print('refused:', e)\n"
    )
    assert run.returncode == 0 and "refused: torchvision to_pil_image" in run.stdout, run.stderr[-2000:]
