"""The learning benchmark's analysis: accuracy at a time, time to a threshold, summaries over seeds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_learning as bl  # noqa: E402

sys.path.pop(0)


def _run(curve: list[list[float]], samples: int, train_s: float) -> dict:
    return {"curve": curve, "samples": samples, "train_s": train_s, "steps": samples // 128}


def test_accuracy_at_a_time_is_the_last_eval_before_it() -> None:
    curve = [[0.0, 0.4], [50.0, 0.6], [130.0, 0.9]]
    assert bl.acc_at(curve, 0) == 0.4 and bl.acc_at(curve, 60) == 0.6 and bl.acc_at(curve, 129.9) == 0.6
    assert bl.acc_at(curve, 130) == 0.9 and bl.acc_at(curve, 10_000) == 0.9
    assert bl.time_to(curve, 0.9) == 130.0 and bl.time_to(curve, 0.5) == 50.0 and bl.time_to(curve, 0.95) is None


def test_summary_over_seeds_reports_mean_spread_and_holding() -> None:
    runs = [_run([[0.0, 0.5], [60.0, 0.92], [240.0, 0.85]], 1280, 240.0),  # reaches 0.90 and loses it
            _run([[0.0, 0.5], [120.0, 0.91], [240.0, 0.96]], 2560, 240.0)]
    s = bl.summarise(runs, budget_s=240.0)
    assert s["samples_per_s"]["mean"] == pytest.approx((1280 + 2560) / 240 / 2)
    assert s["samples_per_s"]["min"] == pytest.approx(1280 / 240)
    assert s["generated_per_s"]["mean"] == s["samples_per_s"]["mean"]  # no group filter: all generated were trained
    runs[1]["generated"] = 3840  # the filter set 160 groups of 8 aside
    assert bl.summarise(runs, budget_s=240.0)["generated_per_s"]["max"] == pytest.approx(3840 / 240)
    assert s["signal_per_s"] == s["samples_per_s"]  # not counted: every trained sample taken to carry a signal
    runs[0]["signal"] = 640  # half of its groups were all-equal (advantage 0)
    assert bl.summarise(runs, budget_s=240.0)["signal_per_s"]["min"] == pytest.approx(640 / 240)
    assert s["accuracy_at_min"]["1"]["mean"] == pytest.approx((0.92 + 0.5) / 2)
    assert s["accuracy_at_min"]["4"] == {"mean": pytest.approx(0.905), "min": 0.85, "max": 0.96, "n": 2, "of": 2}
    assert "8" not in s["accuracy_at_min"]  # beyond the budget
    t90 = s["time_to_s"]["0.90"]
    assert t90["mean"] == 90.0 and t90["n"] == 2 and t90["held_at_end"] == 1
    assert s["time_to_s"]["0.95"]["n"] == 1 and s["time_to_s"]["0.95"]["min"] == 240.0
    assert s["final_accuracy"]["min"] == 0.85


def test_time_ratio_counts_a_plain_run_that_never_got_there_with_the_budget() -> None:
    areal = [_run([[0.0, 0.5], [30.0, 0.96]], 1280, 240.0), _run([[0.0, 0.5], [50.0, 0.95]], 1280, 240.0)]
    plain = [_run([[0.0, 0.5], [100.0, 0.95]], 1280, 240.0), _run([[0.0, 0.5], [240.0, 0.93]], 1280, 240.0)]
    assert bl.time_ratio(areal, plain, 0.95, budget_s=300.0) == pytest.approx(40.0 / 200.0)
    areal[1]["curve"][-1][1] = 0.94  # one areal-agents run never got there: no ratio
    assert bl.time_ratio(areal, plain, 0.95, budget_s=300.0) is None


def test_the_verdict_names_each_target_it_misses() -> None:
    areal = [_run([[0.0, 0.5], [30.0, 0.96], [240.0, 0.97]], 2560, 240.0)]
    plain = [_run([[0.0, 0.5], [120.0, 0.95], [240.0, 0.96]], 1280, 240.0)]
    areal[0]["default"] = {"wall_s": 40.0, "eval_s": 1.6, "eval_share": 0.04, "samples_per_s": 900.0}
    runs = {"areal": areal, "plain": plain}
    summary = {name: bl.summarise(rs, budget_s=240.0) for name, rs in runs.items()}
    v = bl.verdict(summary, runs, budget_s=240.0)
    assert v["samples_per_s_ratio"] == pytest.approx(2.0) and v["time_to_095_ratio"] == pytest.approx(0.25)
    assert v["default_samples_per_s_ratio"] == pytest.approx(900.0 / (1280 / 240.0))
    assert v["eval_share"] == pytest.approx(0.04) and v["meets_target"] and all(v["met"].values())
    areal[0]["default"]["eval_share"] = 0.06  # evals past 5 % of the default command's wall time
    summary["areal"] = bl.summarise(areal, budget_s=240.0)
    v = bl.verdict(summary, runs, budget_s=240.0)
    assert not v["meets_target"] and [k for k, ok in v["met"].items() if not ok] == ["eval_share"]


def test_a_runs_curve_takes_evals_beside_the_loop_at_the_step_they_measured(tmp_path: Path) -> None:
    """Training time is wall time less what the loop stood still for (``time/eval_s``); an eval row
    after a step (an eval that ran beside the next step) is a point at that step's training time."""
    rows = [{"step": 0, "time/elapsed_s": 10.0, "eval/accuracy": 0.5, "time/eval_s": 1.0},
            {"step": 1, "time/elapsed_s": 12.0, "time/train_s": 0.5, "train/n_seqs": 128},
            {"step": 2, "time/elapsed_s": 14.0, "time/train_s": 0.5, "train/n_seqs": 128},
            {"step": 2, "time/elapsed_s": 15.0, "eval/accuracy": 0.8, "time/eval_s": 0.25},
            {"step": 3, "time/elapsed_s": 17.0, "time/train_s": 0.5, "train/n_seqs": 128},
            {"step": 3, "time/elapsed_s": 18.0, "eval/accuracy": 0.9, "time/eval_s": 0.5, "version": 3}]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = bl.read_run(metrics, budget_s=100.0, seed=1)
    assert run["curve"] == [[0.0, 0.5], [4.0, 0.8], [6.75, 0.9]] and run["steps"] == 3 and run["samples"] == 384
    # Step 2 crossed the budget: its eval ends the curve; the final eval, of weights trained one step
    # more, is not put at step 2's time (the run goes on past the budget: trainer.max_time_s)
    cut = bl.read_run(metrics, budget_s=3.0, seed=1)
    assert cut["curve"] == [[0.0, 0.5], [4.0, 0.8]] and cut["steps"] == 2
    cut = bl.read_run(metrics, budget_s=1.5, seed=1)  # step 1 crossed it: no eval of its weights
    assert cut["curve"] == [[0.0, 0.5]] and cut["steps"] == 1
