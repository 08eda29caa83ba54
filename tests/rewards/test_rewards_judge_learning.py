"""A tiny judge alone drives learning: the judge is made here (``areal-agents sft --env
math-grading``), its grading accuracy measured on held-out pairs (``areal-agents eval --env
math-grading``), then the policy trains on ``math`` with **only** the judge's reward (``math-judge``,
one judge call an episode), while its evals keep scoring exact answers (``eval.env_kwargs.reward=math``),
the truth the judge never sees: 60 steps must raise that exact-match greedy accuracy by 15 points (the
recipe's 100 steps measured +35.8, +26.8 by step 50: docs/benchmarks-archive.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
QUIET = ["logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]
SETTINGS = ["trainer.total_steps=60", "trainer.save_every=0", "eval.every=30"]  # the math recipe's, 60 steps


def cli(cache: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "areal_agents.cli", *args, *QUIET], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "AREAL_AGENTS_CACHE": str(cache), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def make_judge(cache: Path, out: Path, *extra: str) -> tuple[Path, float]:
    """The judge (SFT as its recipe says) and its grading accuracy on 500 held-out pairs."""
    cli(cache, "sft", "--env", "math-grading", f"sft.output_dir={out}", f"output_dir={out.parent / 'sft-runs'}", *extra)
    report = out.parent / f"{out.name}-eval.json"
    cli(cache, "eval", "--env", "math-grading", "--model", str(out), "--output", str(report),
        f"output_dir={out.parent / 'eval-runs'}", *extra)
    return out, float(json.loads(report.read_text())["eval/accuracy"])


def train(cache: Path, run_dir: Path, policy: Path, judge: Path, *extra: str) -> list[dict[str, Any]]:
    cli(cache, "run", "--env", "math", f"actor.path={policy}", f"judge.model_path={judge}",
        "eval.env_kwargs.reward=math", f"output_dir={run_dir}", *extra)
    return [json.loads(line) for line in (run_dir / "math" / "trial" / "metrics.jsonl").read_text().splitlines()]


def report(name: str, judge_accuracy: float, rows: list[dict[str, Any]]) -> tuple[float, float]:
    """The exact-match accuracy before and after, printed beside the judge's figures."""
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "train/loss" in r]
    given = sum(r["rollout/reward"] for r in steps) / len(steps)
    curve = " -> ".join(f"{a:.3f}" for a in evals)
    print(f"{name}: judge grading accuracy {judge_accuracy:.3f}; reward the judge gave {given:.3f} (mean of "
          f"{len(steps)} steps); exact-match greedy accuracy {curve}; {steps[-1]['time/elapsed_s']:.0f} s")
    assert not any(k.startswith("rollout/failed/timeout") for r in steps for k in r)
    return evals[0], evals[-1]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the judge's SFT (2,500 steps) and 60 RL steps, beside the rest of the suite
def test_a_tiny_judge_alone_raises_exact_match_accuracy(tmp_path: Path, warm_caches: Any) -> None:
    judge, accuracy = make_judge(tmp_path / "cache", tmp_path / "judge")
    assert accuracy >= 0.9, f"the judge grades {accuracy:.3f} of the held-out pairs right"
    policy = next((warm_caches.get("math") / "warm").glob("math-*"))
    rows = train(tmp_path / "cache", tmp_path / "runs", policy, judge, "env.kwargs.reward=math-judge", *SETTINGS)
    before, after = report("math-judge", accuracy, rows)
    assert after - before >= 0.15, (before, after)
    assert all("perf/judge_calls_per_s" in r and r["time/reward_s"] > 0 for r in rows if "train/loss" in r)

