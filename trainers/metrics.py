"""Run outputs: ``metrics.jsonl``, TensorBoard events, W&B, sample trajectories."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_agents.config import LoggingConfig
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["MetricsLogger"]

log = logging.getLogger("areal_agents.run")
NO_TENSORBOARD = ("logging.tensorboard is on but the tensorboard package is not installed: no TensorBoard events "
                  "(pip install tensorboard, or logging.tensorboard=false to silence this)")


def _clean(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsLogger:
    """Appends one JSON object per step (flushed, so a killed run keeps its history)."""

    def __init__(self, run_dir: str | Path, cfg: LoggingConfig, *, resume: bool = False,
                 config: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.start = time.monotonic()
        self.history: list[dict[str, Any]] = []
        self._metrics = open(self.run_dir / "metrics.jsonl", "a" if resume else "w", encoding="utf-8")  # noqa: SIM115
        self._samples = open(self.run_dir / "samples.jsonl", "a" if resume else "w", encoding="utf-8")  # noqa: SIM115
        self._tb: SummaryWriter | None = None
        self._wandb: Any = None
        if cfg.tensorboard:
            try:  # tensorboard is optional: without it the run says so once and writes the rest
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.warning(NO_TENSORBOARD)
            else:
                # events queue up and are written every 5 s (and at close): a flush a step cost ~3 ms
                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), max_queue=10_000, flush_secs=5)
        if cfg.wandb:
            import wandb

            self._wandb = wandb.init(project=cfg.wandb_project, dir=str(self.run_dir), config=config,
                                     name=self.run_dir.name)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "time/elapsed_s": round(time.monotonic() - self.start, 3),
               **{k: _clean(v) for k, v in metrics.items()}}
        self.history.append(row)
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(row, step=step)

    def log_samples(self, step: int, trajectories: list[Trajectory]) -> None:
        for traj in trajectories[: self.cfg.samples_per_step]:
            self._samples.write(json.dumps({
                "step": step, "prompt": traj.prompt_text, "completion": traj.completion_text,
                "reward": traj.reward, "status": traj.status, "turns": traj.num_turns,
            }, ensure_ascii=False) + "\n")
        self._samples.flush()

    def close(self) -> None:
        for fh in (self._metrics, self._samples):
            if not fh.closed:
                fh.flush()
                os.fsync(fh.fileno())
                fh.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
