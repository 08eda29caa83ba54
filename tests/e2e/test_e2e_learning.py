"""Learning is a feature: the default recipe, as `areal-agents run --env math` runs it from a
clean cache, must raise greedy accuracy on the fixed held-out sums.

The run is the user's command with a shorter RL budget (``trainer.total_steps``; the lr
schedule follows it) and no mid-run evals or checkpoints: the tiny model is built, warm-started
into its accuracy band, served by the embedded server and trained with async GRPO. A broken
advantage sign, loss mask or weight sync makes the gain vanish or turn negative; the margin
below is far under what the recipe gains in this budget and far above eval noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from learning_support import run_default_recipe

pytestmark = pytest.mark.slow

STEPS = 200
MIN_GAIN = 0.10


def test_default_recipe_raises_greedy_accuracy(tmp_path: Path) -> None:
    report, rows = run_default_recipe(tmp_path, "math", STEPS)
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    before, after = evals[0], evals[-1]
    print(f"warm start: {report['steps']} SFT steps, {report['seconds']} s; RL: {before:.3f} -> {after:.3f}")
    assert report["reached"] and report["evals"][-1]["acc"] >= 0.4  # the warm start stopped in its band
    assert 0.2 <= before <= 0.7  # ... which leaves RL room on the 500 held-out sums
    assert len([r for r in rows if "train/loss" in r]) == STEPS
    assert after - before >= MIN_GAIN, f"greedy accuracy {before:.3f} -> {after:.3f} in {STEPS} RL steps"
