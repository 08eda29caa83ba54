"""A tiny judge alone drives learning: the judge is made here (``areal-agents sft --env
math-grading``), its grading accuracy measured on held-out pairs (``areal-agents eval --env
math-grading``), then the policy trains on ``math`` with **only** the judge's reward (``math-judge``,
one judge call an episode), while its evals keep scoring exact answers (``eval.env_kwargs.reward=math``),
the truth the judge never sees: 60 steps must raise that exact-match greedy accuracy by 15 points (the
recipe's 100 steps measured +35.8, +26.8 by step 50: docs/benchmarks-archive.md). The same judge,
fine-tuned on groups, is then the only reward of a policy trained in groups of 4 through one judge call
a group (``math-group-judge``)."""

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


def cli(cache: Path, *args: str, timeout: float = 2700) -> subprocess.CompletedProcess[str]:  # an SFT on groups: ~20 min
    done = subprocess.run([sys.executable, "-m", "areal_agents.cli", *args, *QUIET], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "AREAL_AGENTS_CACHE": str(cache), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def make_judge(cache: Path, out: Path, *extra: str, tune: tuple[str, ...] = ()) -> tuple[Path, float]:
    """A judge (SFT as the recipe says, ``tune`` adding keys of the SFT alone) and its grading accuracy
    on 500 held-out rows (pairs, or groups with ``data.kwargs.candidates`` in ``extra``)."""
    cli(cache, "sft", "--env", "math-grading", f"sft.output_dir={out}", f"output_dir={out.parent / 'sft-runs'}",
        *tune, *extra)
    report = out.parent / f"{out.name}-eval.json"
    cli(cache, "eval", "--env", "math-grading", "--model", str(out), "--output", str(report),
        f"output_dir={out.parent / 'eval-runs'}", *extra)
    return out, float(json.loads(report.read_text())["eval/accuracy"])


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The tiny judge of one answer, made once for this module's tests."""
    root = tmp_path_factory.mktemp("judge")
    return make_judge(root / "cache", root / "judge")


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
def test_a_tiny_judge_alone_raises_exact_match_accuracy(tmp_path: Path, judge: tuple[Path, float],
                                                         warm_caches: Any) -> None:
    model, accuracy = judge
    assert accuracy >= 0.9, f"the judge grades {accuracy:.3f} of the held-out pairs right"
    policy = next((warm_caches.get("math") / "warm").glob("math-*"))
    rows = train(tmp_path / "cache", tmp_path / "runs", policy, model, "env.kwargs.reward=math-judge", *SETTINGS)
    before, after = report("math-judge", accuracy, rows)
    assert after - before >= 0.15, (before, after)
    assert all("perf/judge_calls_per_s" in r and r["time/reward_s"] > 0 for r in rows if "train/loss" in r)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 2,000 SFT steps on groups and 100 RL steps, beside the rest of the suite
def test_a_tiny_group_judge_alone_raises_exact_match_accuracy(tmp_path: Path, judge: tuple[Path, float],
                                                               warm_caches: Any) -> None:
    """The judge of one answer, fine-tuned on groups of up to 4 different answers (as docs/rewards.md
    says), grades whole groups; the policy, in groups of 4, trains on its verdicts alone: one judge
    call a group (``rollout.group_reward=math-group-judge``), the exact-match truth in the evals."""
    groups = ("data.kwargs.candidates=4",)
    model, accuracy = make_judge(tmp_path / "cache", tmp_path / "group-judge", *groups,
                                 tune=(f"actor.path={judge[0]}", "sft.steps=2000", "sft.eval_every=0"))
    assert accuracy >= 0.75, f"the group judge grades {accuracy:.3f} of the held-out groups wholly right"
    policy = next((warm_caches.get("math") / "warm").glob("math-*"))
    rows = train(tmp_path / "cache", tmp_path / "runs", policy, model, "rollout.group_reward=math-group-judge",
                 "rollout.group_size=4", "trainer.total_steps=100", "trainer.save_every=0", "eval.every=50")
    before, after = report("math-group-judge", accuracy, rows)
    assert after - before >= 0.10, (before, after)
    steps = [r for r in rows if "train/loss" in r]
    failed = max(r.get("rollout/failed/reward_error", 0) for r in steps)
    assert failed <= 0.1 * steps[-1]["rollout/submitted"], f"{failed} episodes' groups could not be graded"
