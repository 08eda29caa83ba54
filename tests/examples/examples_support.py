"""Helpers for the example smoke tests: run a command on the embedded default with tiny settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "TINY", "metrics_rows", "run_command", "train_steps"]

ROOT = Path(__file__).resolve().parents[2]

# A couple of steps on the embedded server with the smallest warm start that still exercises it.
TINY = [
    "sft.warm_start_steps=4", "sft.batch_size=8", "sft.eval_every=0", "trainer.total_steps=2", "trainer.save_every=0",
    "rollout.batch_size=2", "rollout.group_size=2", "eval.n=4", "eval.every=0",
    "logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
]


def run_command(cmd: list[str], tmp_path: Path, *, timeout: float = 240, python: str | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` from the repository root with a private model cache under ``tmp_path``.

    ``cmd[0] == "areal-agents"`` runs the CLI with ``python`` (default: this interpreter).
    Fails the test with the tail of the output when the exit code is not 0.
    """
    if cmd[0] == "areal-agents":
        cmd = [python or sys.executable, "-m", "areal_agents.cli", *cmd[1:]]
    full_env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), **(env or {})}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_steps(run_dir: Path) -> list[dict[str, Any]]:
    """The metrics records of training steps (those with a loss)."""
    return [r for r in metrics_rows(run_dir) if "train/loss" in r]
