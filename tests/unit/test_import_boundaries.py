"""The architecture's import rules (DESIGN.md §5b, docs/architecture.md), checked on every run:

- import-linter's contracts in pyproject.toml: the layers import only downward, kv_store and kernels
  import nothing from services, the pure policies import no Ray and no vLLM, no package cycles;
- outside the engine-extension package (services/extensions/) no module imports a private vLLM or
  Ray name or calls one: vLLM only through its public entry points, Ray never through `_private`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from services.common.paths import REPO_ROOT

EXTENSIONS = REPO_ROOT / "services" / "extensions"
# vLLM's public API as omniray uses it outside the extension package: the engine, its arguments and
# its client protocol (streaming input), sampling parameters, the KV-transfer config. Anything else is an internal (scheduler, KV cache,
# attention, connectors, stat loggers) and belongs in services/extensions/vllm/.
VLLM_PUBLIC = {
    "vllm",
    "vllm.config",
    "vllm.engine.arg_utils",
    "vllm.engine.protocol",
    "vllm.sampling_params",
    "vllm.v1.engine.async_llm",
}


def _sources() -> list[Path]:
    roots = ("services", "kv_store", "kernels", "loadtest")
    return [p for root in roots for p in (REPO_ROOT / root).rglob("*.py") if EXTENSIONS not in p.parents]


def _private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        else:
            modules = []
        for m in modules:
            top = m.split(".")[0]
            if top == "vllm" and m not in VLLM_PUBLIC:
                found.append(f"imports {m}")
            if top == "ray" and any(part.startswith("_") for part in m.split(".")):
                found.append(f"imports {m}")
        if isinstance(node, ast.Attribute) and node.attr in ("_private", "_record", "_raylet"):
            found.append(f"uses .{node.attr}")
    return [f"{path.relative_to(REPO_ROOT)}:{f}" for f in found]


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run(
        [str(lint), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_private_vllm_and_ray_names_only_in_the_extension_package():
    found = [use for path in _sources() for use in _private_uses(path)]
    assert not found, "\n".join(found)


def test_kv_store_imports_without_services():
    code = "import sys, kv_store.agent, kv_store.store; print(sorted(m for m in sys.modules if m.startswith('services')))"
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr
