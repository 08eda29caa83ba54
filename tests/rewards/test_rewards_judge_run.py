"""End to end: ``areal-agents run`` with a judge model the run serves (``judge.model_path``): the
env's reward is a registered :class:`~areal_agents.rewards.Judge` that asks it through
``$AREAL_AGENTS_JUDGE_URL`` from the reward workers of the rollout process. A judge whose replies
can be read trains; one whose replies cannot stops the run with one line naming a reply, after
counting every episode as a reward error (never a silent 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
JUDGES = '''
from areal_agents import register_reward
from areal_agents.rewards import Judge

# Stand-in judges made of the math warm start: asked the sum back, its number on a 0-200 scale
# (readable), or asked a yes/no question it never learnt to answer (unreadable).
register_reward("sum-echo-judge")(Judge("{prompt}", scale="0-200", max_tokens=6))
register_reward("yes-no-judge")(Judge("Is {completion} the answer to {prompt}? Say yes or no.", max_tokens=4))
'''
SETTINGS = ["sft.warm_start_steps=4", "sft.batch_size=8", "sft.eval_every=0", "trainer.total_steps=2",
            "trainer.save_every=0", "rollout.batch_size=2", "rollout.group_size=2", "eval.n=4", "eval.every=0",
            "logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]


def run(tmp_path: Path, judge_model: Path, judge: str, *extra: str) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "judges.py").write_text(JUDGES)
    return subprocess.run(
        [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", f"imports=[{tmp_path / 'judges.py'}]",
         f"env.kwargs.reward={judge}", f"judge.model_path={judge_model}", f"output_dir={tmp_path / 'runs'}",
         *SETTINGS, *extra],
        cwd=REPO, env={**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_trains_on_the_rewards_of_the_judge_it_serves(tmp_path: Path, warm_caches: Any) -> None:
    # the judge: the default math warm start (it answers sums), served apart from the policy, whose
    # own short warm start the run builds (an env whose reward is a judge is an env of its own)
    judge_model = next((warm_caches.get("math") / "warm").glob("math-*"))
    done = run(tmp_path, judge_model, "sum-echo-judge")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "math" / "trial"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 2 and not any(k.startswith("rollout/failed/") for r in steps for k in r)
    assert all(0.0 <= r["rollout/reward"] <= 1.0 for r in steps)
    assert (run_dir / "logs" / "judge" / "server-0.log").is_file()  # its own server, never sent weights
    assert "AREAL_AGENTS_JUDGE_URL" not in os.environ

    failing = run(tmp_path / "failing", judge_model, "yes-no-judge")
    lines = failing.stderr.strip().splitlines()
    assert failing.returncode == 1, failing.stdout[-2000:] + failing.stderr[-2000:]
    assert lines[-1].startswith("error: ") and "does not start with yes or no" in lines[-1], lines[-3:]
