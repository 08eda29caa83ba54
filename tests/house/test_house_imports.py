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
    "areal_agents.llm.reference", "areal_agents.cli", "areal_agents.cli.commands", "areal_agents.env",
    "areal_agents.gym", "areal_agents.agent", "areal_agents.rewards", "areal_agents.data", "areal_agents.tools",
    "areal_agents.runtime.threads", "areal_agents.runtime.loop_thread", "areal_agents.runtime.lifeline",
    "areal_agents.runtime.stopping", "areal_agents.runtime.ids", "areal_agents.rollout",
    "areal_agents.rollout.process", "areal_agents.rollout.evaluation", "areal_agents.rollout.preflight",
    "areal_agents.inference.client",
    "areal_agents.inference.sglang_version", "areal_agents.openai_compat.http", "areal_agents.viewer", "areal_agents.record",
]


def test_core_imports_without_torch():
    code = BLOCK_TORCH + "\nimport importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in SDK_MODULES) + (
        "from areal_agents import load_config\nload_config()\nassert 'torch' not in sys.modules\nprint('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


# Runs `areal-agents ARGS` in this interpreter, then says whether it loaded torch or a trainer (the
# registry may load envs and algorithms): the trainers are imported inside the commands that train.
CLI_IMPORTS = """
import sys
from areal_agents.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # argparse ends --help so
    code = exc.code
heavy = sorted(m for m in ("torch", "transformers", "trainers") if m in sys.modules)
print("exit", code, "loaded", ",".join(heavy) or "nothing heavy")
"""


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["list"], ["config", "check"]])
def test_the_light_commands_load_no_torch_and_no_trainer(args):
    proc = subprocess.run([sys.executable, "-c", CLI_IMPORTS, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1] == "exit 0 loaded nothing heavy", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(lines) > 3  # the command printed what it prints


def _contract(name_start: str) -> dict:
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    found = [c for c in contracts if c["name"].startswith(name_start)]
    assert len(found) == 1, [c["name"] for c in contracts]
    return found[0]


def test_every_room_below_the_command_line_is_forbidden_to_import_it():
    """The contract lists its sources (the core's root package holds the command line): a new room
    of the core must join the list."""
    core = ROOT / "areal_agents"
    rooms = {f"areal_agents.{p.stem}" for p in core.glob("*.py") if p.name != "__init__.py"}
    rooms |= {f"areal_agents.{p.name}" for p in core.iterdir() if (p / "__init__.py").exists()}
    contract = _contract("nothing below the command line imports it")
    assert contract["forbidden_modules"] == ["areal_agents.cli"]
    assert sorted(rooms - {"areal_agents.cli"} - set(contract["source_modules"])) == []
    assert {"trainers", "algorithms", "envs"} <= set(contract["source_modules"])


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
