"""Helpers for the example smoke tests: run a command on the embedded default with tiny settings."""

from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["DOCS", "ROOT", "TINY", "load_example", "metrics_rows", "package_env", "run_command", "train_steps"]

ROOT = Path(__file__).resolve().parents[2]

# The user-facing docs: README.md, docs/*.md, examples/*/README.md (paths relative to ROOT).
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("README.md"))]

# A couple of steps on the embedded server with the smallest warm start that still exercises it.
TINY = [
    "sft.warm_start_steps=4", "sft.batch_size=8", "sft.eval_every=0", "trainer.total_steps=2", "trainer.save_every=0",
    "rollout.batch_size=2", "rollout.group_size=2", "eval.n=4", "eval.every=0",
    "logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
]


def load_example(relpath: str) -> ModuleType:
    """Execute the example file ``ROOT/relpath`` as a fresh module (named after its stem)."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_command(cmd: list[str], tmp_path: Path, *, timeout: float = 240, python: str | None = None,
                env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` from ``cwd`` (default: the repository root) with a private model cache under ``tmp_path``.

    ``cmd[0] == "areal-agents"`` (or ``"python"``) runs the CLI (or that script) with ``python``
    (default: this interpreter). Fails the test with the tail of the output when the exit code is not 0.
    """
    if cmd[0] == "areal-agents":
        cmd = [python or sys.executable, "-m", "areal_agents.cli", *cmd[1:]]
    elif cmd[0] in ("python", "python3"):
        cmd = [python or sys.executable, *cmd[1:]]
    full_env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_steps(run_dir: Path) -> list[dict[str, Any]]:
    """The metrics records of training steps (those with a loss)."""
    return [r for r in metrics_rows(run_dir) if "train/loss" in r]


def package_env(root: Path, package: Path) -> str:
    """A throw-away virtual environment under ``root`` with ``package`` pip-installed (editable,
    no dependencies, built with this environment's setuptools); returns its python.

    Besides the package it sees exactly what the interpreter running the tests sees: a ``.pth``
    file adds this interpreter's site directories. (``--system-site-packages`` would not do: it
    shows the *base* interpreter's packages, which in a fresh virtualenv lack torch, this project
    and a setuptools with ``bdist_wheel``.) The interpreter running the tests never sees the package.
    """
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    ours = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    adds = "".join(f"; site.addsitedir({p!r})" for p in ours if os.path.isdir(p))  # a .pth runs one line
    Path(purelib, "_tests_outer_site.pth").write_text(f"import site{adds}\n")
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(package)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return python
