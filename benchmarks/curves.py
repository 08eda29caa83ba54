"""Learning curves of ``areal-agents run``: a run's ``metrics.jsonl`` read as the learning benchmarks
count it (``bench_learning.py``, ``bench_credit.py``), and figures summarised over seeds.

Training time is the run's clock since its first step began (after start-up and the step-0 eval)
less what the loop stood still for evals (``time/eval_s``): an eval between steps runs beside the
next step and comes in a row of its own after the step whose weights it measured, so it is a point
at that step's training time. Read with a budget, a run stops at the first step that begins past
it, and its curve ends with its last eval within the budget: a run goes on past its budget
(``trainer.max_time_s`` counts start-up and evals too), so its final eval measured weights trained
longer than the budget allows and is not the budget's figure.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Training", "first_reach", "read_metrics", "read_training", "spread"]


@dataclass(frozen=True)
class Training:
    """A run up to its budget: ``curve`` is ``[[train_s, step, accuracy], ...]`` from the step-0 eval on
    (one point a step), ``steps`` its step rows, ``train_s`` the training time at its last step."""

    curve: list[list[float]]
    steps: list[dict[str, Any]]
    train_s: float


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl``."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_training(rows: list[dict[str, Any]], budget_s: float = math.inf) -> Training:
    """The curve and step rows of a run's metrics ``rows`` (the step-0 eval's row first), up to ``budget_s``
    seconds of training time (see the module's docstring)."""
    origin = rows[0]["time/elapsed_s"]
    curve: list[list[float]] = [[0.0, 0, rows[0]["eval/accuracy"]]]
    steps: list[dict[str, Any]] = []
    eval_s = train_s = 0.0
    step = 0
    for row in rows[1:]:  # step rows, and eval rows after the step whose weights they measured
        if "time/train_s" in row and train_s >= budget_s:
            break
        eval_s += row.get("time/eval_s", 0.0)  # what the loop stood still for
        if "time/train_s" in row:
            train_s, step = row["time/elapsed_s"] - origin - eval_s, int(row["step"])
            steps.append(row)
        if "eval/accuracy" in row and curve[-1][1] < step:  # one point a step (older runs: also in the step's row)
            curve.append([train_s, step, row["eval/accuracy"]])
    return Training(curve, steps, train_s)


def first_reach(curve: list[list[float]], level: float) -> list[float] | None:
    """The first point of ``curve`` whose accuracy (its last field) is at least ``level``, or None."""
    return next((point for point in curve if point[-1] >= level - 1e-9), None)


def spread(values: list[float | None]) -> dict[str, Any]:
    """Mean, min and max of the values that are not None, ``n`` of them ``of`` all."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "min": None, "max": None, "n": 0, "of": len(values)}
    return {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals), "n": len(vals), "of": len(values)}
