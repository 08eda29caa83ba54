"""PNG plots of a run directory's ``metrics.jsonl`` (also ``areal-agents plot RUN_DIR``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["PLOTS", "plot_run", "read_metrics"]

# file name -> (title, [(metric key, label)], x axis key)
PLOTS: dict[str, tuple[str, list[tuple[str, str]], str]] = {
    "reward_vs_step.png": ("Reward and eval accuracy", [("rollout/reward", "train reward"),
                                                        ("eval/accuracy", "eval accuracy (greedy)")], "step"),
    "reward_vs_time.png": ("Reward and eval accuracy vs wall time", [("rollout/reward", "train reward"),
                                                                     ("eval/accuracy", "eval accuracy (greedy)")],
                           "time/elapsed_s"),
    "throughput.png": ("Throughput", [("perf/gen_tokens_per_s", "generated tokens/s"),
                                      ("perf/train_tokens_per_s", "trained tokens/s")], "step"),
    "staleness.png": ("Staleness (versions behind)", [("staleness/mean", "mean"), ("staleness/max", "max")], "step"),
    "loss.png": ("Training loss", [("train/loss", "loss"), ("train/clip_frac", "clip fraction")], "step"),
}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``; unreadable lines (e.g. a torn last line) are skipped."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _series(rows: list[dict[str, Any]], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    points = [(float(x), float(y)) for x, y in ((row.get(x_key), row.get(y_key)) for row in rows)
              if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y)]
    return [x for x, _ in points], [y for _, y in points]


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write the PNGs of :data:`PLOTS` under ``run_dir/plots`` and return their paths."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    run_dir = Path(run_dir)
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        raise FileNotFoundError(f"{metrics_file} not found: is {run_dir} a run directory?")
    rows = read_metrics(metrics_file)
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    written = []
    for name, (title, keys, x_key) in PLOTS.items():
        curves = [(label, *_series(rows, x_key, key)) for key, label in keys]
        curves = [c for c in curves if c[1]]
        if not curves:
            continue
        fig = Figure(figsize=(7, 4))
        ax = fig.subplots()
        for label, xs, ys in curves:
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("wall time (s)" if x_key == "time/elapsed_s" else x_key)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=100)
        written.append(path)
    return written
