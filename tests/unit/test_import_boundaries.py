"""The architecture's import rules (DESIGN.md §5b, docs/architecture.md), checked on every run:

- import-linter's contracts in pyproject.toml: the layers import only downward, kv_store and kernels
  import nothing from services, the pure policies import no Ray and no vLLM, no package cycles;
- outside the engine-extension package (services/extensions/) no module imports a private vLLM or
  Ray name or calls one: vLLM only through its public entry points, Ray never through `_private`;
  nor reads an underscore attribute or passes an underscore keyword that omniray's own code does not
  define (a library's private field or option: grpcio's handler table, Serve's `_by_reference`), nor
  reaches into the vLLM engine's parts (its output processor, its engine core).
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


# Underscore names that are public by contract, or private to a model library rather than to the
# engine, Serve or grpcio (the fence's subject): namedtuple's API; torch's compile settings (how its
# docs set the recompile limit); transformers' model construction from a config and its attention
# implementation.
UNDERSCORE_ALLOWED = {
    "_replace",
    "_asdict",
    "_fields",
    "_make",
    "_dynamo",
    "_from_config",
    "_attn_implementation",
}
# The vLLM engine's parts: reached only through services/extensions/vllm/.
ENGINE_PARTS = {"output_processor", "engine_core", "input_processor", "model_executor"}


def _sources() -> list[Path]:
    roots = ("services", "kv_store", "kernels", "loadtest")
    return [p for root in roots for p in (REPO_ROOT / root).rglob("*.py") if EXTENSIONS not in p.parents]


def _own_names() -> set[str]:
    """Every name omniray's code defines: functions, classes, parameters, variables, attributes it
    sets on its own objects (`self.x = ...`), import aliases."""
    roots = ("services", "kv_store", "kernels", "loadtest", "tests")
    names = set()
    for path in (p for root in roots for p in (REPO_ROOT / root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):  # fmt: skip
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    return names


def _private_uses(path: Path, own: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def foreign(name: str) -> bool:
        private = name.startswith("_") and not name.startswith("__")
        return private and name not in own and name not in UNDERSCORE_ALLOWED

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
        elif isinstance(node, ast.Attribute) and (foreign(node.attr) or node.attr in ENGINE_PARTS):
            found.append(f"{node.lineno}: reads .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg and foreign(node.arg):
            found.append(f"{node.lineno}: passes {node.arg}=")
    return [f"{path.relative_to(REPO_ROOT)}:{f}" for f in found]


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run(
        [str(lint), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_private_vllm_ray_and_grpcio_names_only_in_the_extension_package():
    own = _own_names()
    found = [use for path in _sources() for use in _private_uses(path, own)]
    assert not found, "\n".join(found)


def test_kv_store_imports_without_services():
    code = "import sys, kv_store.agent, kv_store.store; print(sorted(m for m in sys.modules if m.startswith('services')))"
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr
