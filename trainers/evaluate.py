"""Greedy accuracy and pass@k of a model on an env's test split (``areal-agents eval``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.progress import Progress

from areal_agents.config import ExperimentConfig
from areal_agents.data import load_dataset_rows
from areal_agents.rewards import RewardRunner
from areal_agents.rollout.evaluation import run_eval

__all__ = ["evaluate_model"]


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
