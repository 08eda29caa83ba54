"""The learning benchmarks' one reader of a run's metrics: training time, the curve, the budget's cut."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import curves  # noqa: E402

sys.path.pop(0)

# Evals the loop waited for, in the step's own row (runs before evals ran beside the loop)
IN_STEP_ROWS = [{"step": 0, "time/elapsed_s": 10.0, "eval/accuracy": 0.2},
                {"step": 1, "time/elapsed_s": 15.0, "time/train_s": 1.0},
                {"step": 2, "time/elapsed_s": 30.0, "time/train_s": 1.0, "eval/accuracy": 0.5, "time/eval_s": 5.0},
                {"step": 3, "time/elapsed_s": 40.0, "time/train_s": 1.0},
                {"step": 4, "time/elapsed_s": 60.0, "time/train_s": 1.0, "eval/accuracy": 0.9, "time/eval_s": 5.0},
                {"step": 4, "time/elapsed_s": 70.0, "eval/accuracy": 0.8}]  # the final eval
# Evals beside the loop: rows of their own after the step they measured, the loop's wait in time/eval_s
BESIDE_ROWS = [{"step": 0, "time/elapsed_s": 10.0, "eval/accuracy": 0.2},
               {"step": 1, "time/elapsed_s": 15.0, "time/train_s": 1.0},
               {"step": 2, "time/elapsed_s": 30.0, "time/train_s": 1.0},
               {"step": 2, "time/elapsed_s": 31.0, "eval/accuracy": 0.5, "time/eval_s": 2.0},
               {"step": 3, "time/elapsed_s": 40.0, "time/train_s": 1.0},
               {"step": 3, "time/elapsed_s": 45.0, "eval/accuracy": 0.8, "time/eval_s": 5.0}]  # the final eval


def test_training_time_leaves_out_what_the_loop_stood_still_for() -> None:
    run = curves.read_training(IN_STEP_ROWS)
    assert run.curve == [[0.0, 0, 0.2], [15.0, 2, 0.5], [40.0, 4, 0.9]] and run.train_s == 40.0
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]  # the final eval's row is no step
    run = curves.read_training(BESIDE_ROWS, math.inf)
    assert run.curve == [[0.0, 0, 0.2], [20.0, 2, 0.5], [28.0, 3, 0.8]] and run.train_s == 28.0


def test_a_run_cut_at_its_budget_ends_with_its_last_eval_within_it() -> None:
    # step 3 began past 20 s (at 15 s of training it was not; at 25 s it was): steps 1-3 are the
    # budget's; the final eval measured step 4's weights, trained past it, and is not its figure
    run = curves.read_training(IN_STEP_ROWS, budget_s=20.0)
    assert run.curve == [[0.0, 0, 0.2], [15.0, 2, 0.5]] and run.train_s == 25.0
    assert [r["step"] for r in run.steps] == [1, 2, 3]
    run = curves.read_training(BESIDE_ROWS, budget_s=10.0)  # step 2 crossed it: its eval is the last point
    assert run.curve == [[0.0, 0, 0.2], [20.0, 2, 0.5]] and len(run.steps) == 2
    run = curves.read_training(BESIDE_ROWS, budget_s=4.0)  # step 1 crossed it: no eval of its weights
    assert run.curve == [[0.0, 0, 0.2]] and len(run.steps) == 1


def test_first_reach_spread_and_reading_the_file(tmp_path: Path) -> None:
    curve = [[0.0, 0, 0.2], [15.0, 2, 0.5], [40.0, 4, 0.9]]
    assert curves.first_reach(curve, 0.5) == [15.0, 2, 0.5] and curves.first_reach(curve, 0.95) is None
    assert curves.first_reach([[0.0, 0.2], [7.0, 0.9]], 0.9) == [7.0, 0.9]  # the accuracy is the last field
    assert curves.spread([3.0, None, 1.0]) == {"mean": 2.0, "min": 1.0, "max": 3.0, "n": 2, "of": 3}
    assert curves.spread([None]) == {"mean": None, "min": None, "max": None, "n": 0, "of": 1}
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in BESIDE_ROWS) + "\n")
    assert curves.read_metrics(metrics) == BESIDE_ROWS
