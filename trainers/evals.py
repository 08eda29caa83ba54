"""Rank 0's greedy evals in a run: the first and the last hold the loop, those between run beside it.

An eval between steps (every ``eval.every`` steps) measures the weights the step just made while
the loop goes on to the next batch and its train step, which need no server of their own; it must
end before the next weight sync changes what the servers decode with, so :meth:`Evals.settle`
(called just before that sync, and before the final eval) waits for it and hands back its row.
The row's ``time/eval_s`` is what the loop stood still for: the whole eval when it holds the loop,
the wait in :meth:`Evals.settle` when it ran beside it; ``eval/wall_s`` is the eval's own time.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from areal_agents.config import ExperimentConfig
from areal_agents.data import load_dataset_rows
from areal_agents.rollout.evaluation import run_eval

if TYPE_CHECKING:
    from areal_agents.rewards import RewardRunner

__all__ = ["Evals"]


class Evals:
    """The evals of one run on the servers at ``addresses`` (none on ranks without them: no rows,
    nothing to do), over the env's test rows (``eval.n`` of them), with the evals' own rewards."""

    def __init__(self, cfg: ExperimentConfig, tokenizer: Any, addresses: list[str], progress: Any = None,
                 rewards: RewardRunner | None = None) -> None:
        self.cfg, self.tokenizer, self.addresses, self.progress, self.rewards = cfg, tokenizer, addresses, progress, rewards
        self.rows = load_dataset_rows(cfg, "test")[: cfg.eval.n] if addresses else []
        self._pending: tuple[int, threading.Thread, dict[str, Any]] | None = None

    def _eval(self) -> dict[str, Any]:
        return run_eval(self.cfg, self.tokenizer, self.addresses, self.rows, self.progress,
                        lora_path=self.cfg.actor.lora.served, reward_runner=self.rewards)

    def now(self) -> dict[str, Any]:
        """An eval that holds the loop (before the first step, after the last): its metrics."""
        if self._pending is not None:
            raise RuntimeError("an eval is still running beside the loop: settle() it first")
        report = self._eval()
        return {**report, "eval/wall_s": report["time/eval_s"]} if report else report

    def start(self, step: int) -> None:
        """An eval of the weights ``step`` made, in a thread beside the loop, until :meth:`settle`."""
        if not self.rows:
            return
        if self._pending is not None:
            raise RuntimeError("an eval is still running beside the loop: settle() it first")
        box: dict[str, Any] = {}
        t0 = time.monotonic()

        def go() -> None:
            try:
                box["report"] = {**self._eval(), "eval/wall_s": time.monotonic() - t0}
            except BaseException as exc:  # noqa: BLE001 - raised again in the loop's thread by settle()
                box["error"] = exc

        thread = threading.Thread(target=go, name=f"eval-step-{step}", daemon=True)
        thread.start()
        self._pending = (step, thread, box)

    def settle(self) -> tuple[int, dict[str, Any]] | None:
        """Wait for the eval :meth:`start` began, if any: ``(its step, its metrics)``, with
        ``time/eval_s`` the seconds waited here. Its error, if it failed, is raised here."""
        if self._pending is None:
            return None
        step, thread, box = self._pending
        t0 = time.monotonic()
        thread.join()
        self._pending = None
        if "error" in box:
            raise box["error"]
        return step, {**box["report"], "time/eval_s": time.monotonic() - t0}
