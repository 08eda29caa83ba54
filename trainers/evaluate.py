"""``areal-agents eval``: greedy accuracy and pass@k of a model on an env's test split."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from areal_agents.config import ExperimentConfig
from areal_agents.data import load_dataset_rows
from areal_agents.rewards import RewardRunner
from areal_agents.rollout.evaluation import run_eval

__all__ = ["cli_eval", "evaluate_model"]


def evaluate_model(cfg: ExperimentConfig, model_path: str, *, progress: bool = True) -> dict[str, Any]:
    """Serve ``model_path`` (or attach to ``inference.addresses``) and evaluate the test split."""
    import transformers

    from areal_agents.inference.launcher import inference_servers

    transformers.utils.logging.disable_progress_bar()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    rows = load_dataset_rows(cfg, "test")[: cfg.eval.n]
    if not rows:
        raise ValueError(f"env {cfg.env.name!r}: the test split is empty (data.test_size={cfg.data.test_size})")
    t0 = time.monotonic()
    with inference_servers(cfg, model_path, log_dir=Path(cfg.run_dir) / "logs") as addresses, \
            RewardRunner.for_rollout(cfg.rollout) as rewards, Progress(disable=not progress) as bar:
        report = run_eval(cfg, tokenizer, addresses, rows, bar, reward_runner=rewards)
    report.update({"env": cfg.env.name, "model": model_path, "k": cfg.eval.k, "seconds": round(time.monotonic() - t0, 1)})
    return report


def cli_eval(args: argparse.Namespace) -> int:
    cfg: ExperimentConfig = args.cfg
    model_path = args.model or cfg.actor.path
    if not model_path:
        from trainers.sft import ensure_warm_model

        model_path = str(ensure_warm_model(cfg, progress=cfg.logging.progress, warm_start=True))
    report = evaluate_model(cfg, model_path, progress=cfg.logging.progress)
    out = Path(args.output) if args.output else Path(cfg.run_dir) / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    table = Table(title=f"eval: {cfg.env.name}", title_justify="left", show_header=False)
    for key, value in report.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    table.add_row("report", str(out))
    Console().print(table)
    return 0
