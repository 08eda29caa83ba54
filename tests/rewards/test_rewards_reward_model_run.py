"""End to end, as docs/rewards.md ("Reward models") writes it: ``areal-agents rm --env math
data.name=math-preference`` trains a reward model from the math warm start (the one ``run`` uses:
nothing else is built), and ``areal-agents run`` serves it (``judge.model_path``) and trains the
policy on the scores of ``math-reward-model``, counted as judge calls, none failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from areal_agents.inference.scoring import is_reward_model

REPO = Path(__file__).resolve().parents[2]
QUIET = ["logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]


def cli(cache: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "areal_agents.cli", *args, *QUIET], cwd=REPO, capture_output=True,
                          text=True, timeout=900,
                          env={**os.environ, "AREAL_AGENTS_CACHE": str(cache), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_reward_model_trained_here_is_served_and_trains_the_policy(tmp_path: Path,
                                                                     warm_cache: Callable[[str], Path]) -> None:
    cache = warm_cache("math")
    rm = tmp_path / "reward_models" / "math"
    cli(cache, "rm", "--env", "math", "data.name=math-preference", f"reward_model.output_dir={rm}",
        f"output_dir={tmp_path / 'rm-runs'}")
    report = json.loads((rm / "rm_report.json").read_text())
    assert is_reward_model(rm) and report["pairs"] == 2000 and report["steps"] == 2000 // 32
    assert report["evals"][-1]["accuracy"] >= 0.6, report  # it prefers the right sum to a near miss, mostly

    cli(cache, "run", "--env", "math", "env.kwargs.reward=math-reward-model", f"judge.model_path={rm}",
        "eval.env_kwargs.reward=math", f"output_dir={tmp_path / 'runs'}", "trainer.total_steps=3",
        "trainer.save_every=0", "eval.every=0")
    run_dir = tmp_path / "runs" / "math" / "trial"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 3 and not any(k.startswith("rollout/failed/") for r in steps for k in r)
    assert all(0.0 < r["rollout/reward"] < 1.0 and r["perf/judge_calls_per_s"] > 0 for r in steps)
    assert any("eval/accuracy" in r for r in rows)  # the truth, by exact answers, beside the scores
    assert (run_dir / "logs" / "judge" / "server-0.log").is_file()
