"""The learning tests' run: a built-in env's default command from a clean cache, shortened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_default_recipe(tmp_path: Path, env_name: str, steps: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``areal-agents run --env ENV`` with ``steps`` RL steps, no mid-run evals or checkpoints,
    from an empty cache under ``tmp_path``; returns the warm start's ``sft_report.json`` and the
    run's metrics rows (the first and last carry the evals before and after RL)."""
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "areal_agents.cli", "run", "--env", env_name, f"output_dir={tmp_path / 'runs'}",
         f"trainer.total_steps={steps}", "eval.every=0", "trainer.save_every=0", "logging.progress=false",
         "logging.plots=false"],
        capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(next((tmp_path / "cache" / "warm").glob(f"{env_name}-*/sft_report.json")).read_text())
    metrics = tmp_path / "runs" / env_name / "trial" / "metrics.jsonl"
    return report, [json.loads(line) for line in metrics.read_text().splitlines()]
