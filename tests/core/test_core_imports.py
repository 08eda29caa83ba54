"""Dependency direction (import-linter) and a torch-free core."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A meta-path finder that makes `import torch` fail, as in a venv without torch.
BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not installed (blocked by test)")
        return None
sys.meta_path.insert(0, _NoTorch())
"""

SDK_MODULES = [
    "areal_agents", "areal_agents.registry", "areal_agents.config", "areal_agents.config.loader",
    "areal_agents.types", "areal_agents.failures", "areal_agents.llm", "areal_agents.llm.scripted",
    "areal_agents.llm.reference", "areal_agents.cli", "areal_agents.cli.preflight", "areal_agents.env",
    "areal_agents.gym", "areal_agents.agent", "areal_agents.rewards", "areal_agents.data", "areal_agents.tools",
    "areal_agents.runtime.threads", "areal_agents.runtime.loop_thread", "areal_agents.runtime.lifeline",
    "areal_agents.runtime.stopping", "areal_agents.runtime.ids", "areal_agents.rollout",
    "areal_agents.rollout.process", "areal_agents.rollout.evaluation", "areal_agents.inference.client",
    "areal_agents.inference.sglang_version", "areal_agents.openai_compat.http",
    "areal_agents.testing",
]


def test_core_imports_without_torch():
    code = BLOCK_TORCH + "\nimport importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in SDK_MODULES) + (
        "from areal_agents import load_config\nload_config()\nassert 'torch' not in sys.modules\nprint('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_import_linter_contracts():
    exe = shutil.which("lint-imports")
    assert exe is not None, "import-linter is a dev dependency: pip install -e '.[dev]'"
    proc = subprocess.run([exe, "--no-cache"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_static_checks(tool):
    exe = shutil.which(tool)
    assert exe is not None, f"{tool} is a dev dependency"
    args = [exe, "check", "."] if tool == "ruff" else [exe]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> modules it imports): its strongly connected
    components of more than one module, and modules that import themselves."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1 or module in graph[module]:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_module_imports_another_in_a_cycle():
    import grimp  # comes with import-linter, a dev dependency

    built = grimp.build_graph("areal_agents", "envs", "algorithms", "trainers", cache_dir=None)
    graph = {m: set(built.find_modules_directly_imported_by(m)) & built.modules for m in built.modules}
    assert len(graph) > 50  # every package was read
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"], ["d"]]
