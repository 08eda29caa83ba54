"""Learning is a feature: the default recipe, as `areal-agents run --env math` runs it from a
clean cache, must raise greedy accuracy on the fixed held-out sums.

The run is the user's command with a shorter RL budget (``trainer.total_steps``; the lr
schedule follows it) and no mid-run evals or checkpoints: the tiny model is built, warm-started
into its accuracy band, served by the embedded server and trained with async GRPO. A broken
advantage sign, loss mask or weight sync makes the gain vanish or turn negative; the margin
below is far under what the recipe gains in this budget and far above eval noise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPS = 200
MIN_GAIN = 0.10


def test_default_recipe_raises_greedy_accuracy(tmp_path: Path) -> None:
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", f"output_dir={tmp_path / 'runs'}",
         f"trainer.total_steps={STEPS}", "eval.every=0", "trainer.save_every=0", "logging.progress=false",
         "logging.plots=false"],
        capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(next((tmp_path / "cache" / "warm").glob("math-*/sft_report.json")).read_text())
    rows = [json.loads(line) for line in (tmp_path / "runs" / "math" / "trial" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    before, after = evals[0], evals[-1]
    print(f"warm start: {report['steps']} SFT steps, {report['seconds']} s; RL: {before:.3f} -> {after:.3f}")
    assert report["reached"] and report["evals"][-1]["acc"] >= 0.4  # the warm start stopped in its band
    assert 0.2 <= before <= 0.7  # ... which leaves RL room on the 500 held-out sums
    assert len([r for r in rows if "train/loss" in r]) == STEPS
    assert after - before >= MIN_GAIN, f"greedy accuracy {before:.3f} -> {after:.3f} in {STEPS} RL steps"
