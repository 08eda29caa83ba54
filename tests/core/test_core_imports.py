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
    "areal_agents", "areal_agents.registry", "areal_agents.config", "areal_agents.config_loader",
    "areal_agents.types", "areal_agents.llm", "areal_agents.cli",
]
OPTIONAL_SDK = ["areal_agents.env", "areal_agents.agent", "areal_agents.rewards", "areal_agents.data",
                "areal_agents.sandbox", "areal_agents.rollout", "areal_agents.inference.client",
                "areal_agents.inference.llm_client", "areal_agents.testing"]


def test_core_imports_without_torch():
    modules = SDK_MODULES + [m for m in OPTIONAL_SDK if (ROOT / (m.replace(".", "/") + ".py")).exists()]
    code = BLOCK_TORCH + "\nimport importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + (
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
