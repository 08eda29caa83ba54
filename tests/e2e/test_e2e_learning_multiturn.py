"""Learning is a feature for multi-turn agents too: ``areal-agents run --env math-multiturn``
from a clean cache must raise greedy *episode* success on the held-out sums.

An episode is up to three tries at a sum, with "Wrong, try again." after a miss, so each
trajectory holds several generated turns with env messages between them. The warm start
trains whole reference episodes and checks greedy episodes through the env, as the eval does
(so the eval at step 0 is where the warm start stopped). A broken advantage sign (seen red:
0.598 -> 0.000) or a weight sync that does not reach the server makes the gain vanish; the
margin below is far under what the recipe gains in this budget and far above eval noise.
Bookkeeping bugs that leave this env's learning intact are guarded by unit tests instead: a loss
mask that covers the env's messages (planted, the run still went 0.598 -> 0.882: those tokens
carry a behaviour logprob of 0, so PPO's clip drops them on a negative advantage, and the policy
never has to write them) in ``tests/agent/test_agent_chat.py``, and a turn discount the wrong way
round (``math-multiturn`` uses 1.0) in ``tests/rollout/test_rollout_returns.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from learning_support import run_default_recipe

pytestmark = pytest.mark.slow

STEPS = 60
MIN_GAIN = 0.10


def test_multi_turn_recipe_raises_greedy_episode_success(tmp_path: Path) -> None:
    report, rows = run_default_recipe(tmp_path, "math-multiturn", STEPS)
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    before, after = evals[0], evals[-1]
    print(f"warm start: {report['steps']} SFT steps, {report['seconds']} s; RL: {before:.3f} -> {after:.3f}")
    assert report["check"] == "episodes"  # the warm start measured what the eval measures ...
    assert report["reached"] and abs(report["evals"][-1]["acc"] - before) < 0.15  # ... and the two agree
    assert 0.2 <= before <= 0.8  # RL has room on the 500 held-out sums
    assert len([r for r in rows if "train/loss" in r]) == STEPS
    multi = [r["rollout/turns"] for r in rows if "rollout/turns" in r]
    assert sum(multi) / len(multi) > 1.05  # the episodes really are multi-turn
    assert after - before >= MIN_GAIN, f"greedy episode success {before:.3f} -> {after:.3f} in {STEPS} RL steps"
