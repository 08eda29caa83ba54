"""What the user sees during ``areal-agents run``: a live progress bar and a final summary."""

from __future__ import annotations

import logging
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from areal_agents.config import ExperimentConfig

__all__ = ["RunDisplay", "SignalWatch"]

log = logging.getLogger("areal_agents.run")


def _fmt(value: object, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


class _StatsColumn(ProgressColumn):
    """The ``stats`` field of a task; tasks added by others (eval) have none."""

    def render(self, task: Task) -> Text:
        return Text(str(task.fields.get("stats", "")))


class SignalWatch:
    """Counts steps without learning signal (``rollout/signal_groups == 0``: every group's rewards
    equal, so group baselines give zero advantages) and says so once after ``warn_steps`` in a row."""

    def __init__(self, warn_steps: int) -> None:
        self.warn_steps = warn_steps
        self.steps = self.flat_steps = self.streak = 0
        self.warned_at: int | None = None

    def update(self, step: int, metrics: dict[str, Any]) -> str | None:
        """Take one step's metrics; return the warning the first time the streak reaches ``warn_steps``."""
        signal = metrics.get("rollout/signal_groups")
        if not isinstance(signal, (int, float)):
            return None
        self.steps += 1
        flat = signal == 0
        self.flat_steps += flat
        self.streak = self.streak + 1 if flat else 0
        if not self.warn_steps or self.streak < self.warn_steps or self.warned_at is not None:
            return None
        self.warned_at = step
        reward = metrics.get("rollout/reward")
        constant = " and every episode got the same reward" if metrics.get("rollout/reward_std") == 0 else ""
        return (f"no learning signal: every group's rewards were equal for {self.streak} steps in a row (steps "
                f"{step - self.streak + 1}-{step}, mean reward {_fmt(reward)}){constant}, so advantages and loss are 0. "
                "Check: is the reward constant (samples.jsonl)? is the task too hard or too easy for the model "
                "(eval accuracy 0 or 1; sft.warm_start_steps)? are replies cut off (sampling.max_new_tokens, "
                "agent.max_tokens)? More samples per prompt (rollout.group_size, sampling.temperature) or "
                "rollout.group_filter=nonzero_std also help.")

    @property
    def status(self) -> str | None:
        """One line for the summary table (None before any step)."""
        if not self.steps:
            return None
        text = f"{self.steps - self.flat_steps} of {self.steps} steps had groups with different rewards"
        if self.warned_at is not None:
            text += f"; NONE for {self.warn_steps}+ steps in a row from step {self.warned_at - self.warn_steps + 1}"
        return text


class RunDisplay:
    """Rich progress (step, reward, eval accuracy, staleness, tokens/s, ETA) and a summary table."""

    def __init__(self, cfg: ExperimentConfig, *, enabled: bool = True, console: Console | None = None) -> None:
        self.cfg = cfg
        self.console = console or Console()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            _StatsColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, disable=not enabled, transient=False,
        )
        self._task: TaskID | None = None
        self._accuracy: object = None
        self.signal = SignalWatch(cfg.rollout.no_signal_warn_steps)

    def start(self, total: int, done: int = 0) -> None:
        self.progress.start()
        self._task = self.progress.add_task("RL", total=total, completed=done, stats="")

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        self._accuracy = metrics.get("eval/accuracy", self._accuracy)
        warning = self.signal.update(step, metrics)
        if warning is not None:  # on stderr, which the live display shows above its bar
            log.warning(warning)
        stats = (f"reward {_fmt(metrics.get('rollout/reward'))} | eval acc {_fmt(self._accuracy, '.2f')} | "
                 f"stale {_fmt(metrics.get('staleness/mean'), '.2f')} | "
                 f"{_fmt(metrics.get('perf/gen_tokens_per_s'), '.0f')} gen tok/s")
        if self.signal.warned_at is not None and self.signal.streak:
            stats += " | NO LEARNING SIGNAL"
        if self._task is not None:
            self.progress.update(self._task, completed=step, stats=stats)

    def show_eval(self, metrics: dict[str, Any]) -> None:
        """An eval's result (one that ran beside the loop), shown from the next step on."""
        self._accuracy = metrics.get("eval/accuracy", self._accuracy)

    def note(self, text: str) -> None:
        # plain text: a note quotes error messages, whose brackets are not markup
        self.progress.console.print(text, style="dim", markup=False, highlight=False)

    def stop(self) -> None:
        self.progress.stop()

    def summary(self, summary: dict[str, Any]) -> None:
        """The end-of-run table (for ``mode=train`` / ``mode=rollout``, what that mode produced)."""
        table = Table(title=f"areal-agents run{'' if self.cfg.mode == 'full' else f' (mode={self.cfg.mode})'}",
                      title_justify="left", show_header=False)
        table.add_column("", style="bold")
        table.add_column("")
        run_dir = summary.get("run_dir", "-")
        if self.cfg.mode == "train":
            rows = [("trained from", str(self.cfg.train_data)), ("steps", str(summary.get("steps", "-"))),
                    ("run dir", run_dir), ("metrics", f"{run_dir}/metrics.jsonl"),
                    ("final model", summary.get("final_model", "-"))]
        elif self.cfg.mode == "rollout":
            failed = summary.get("rollout/failed")
            rows = [("env", self.cfg.env.name), ("episodes written", str(summary.get("episodes", "-"))),
                    ("failed episodes", _fmt(failed, ".0f")), ("seconds", _fmt(summary.get("seconds"), ".1f")),
                    ("trajectories", summary.get("path", "-"))]
        else:
            rows = self._full_rows(summary)
        for key, value in rows:
            table.add_row(key, str(value))
        self.console.print(table)

    def _full_rows(self, summary: dict[str, Any]) -> list[tuple[str, Any]]:
        rows = [
            ("env / algorithm", f"{self.cfg.env.name} / {self.cfg.algorithm.name}"),
            ("steps (weight version)", f"{summary.get('steps', '-')} ({summary.get('version', '-')})"),
            ("eval accuracy before RL", _fmt(summary.get("accuracy_before"), ".3f")),
            ("eval accuracy after RL", _fmt(summary.get("accuracy_after"), ".3f")),
            ("wall time", f"{_fmt(summary.get('wall_time_s'), '.1f')} s"),
            ("generation throughput", f"{_fmt(summary.get('gen_tokens_per_s'), '.0f')} tokens/s"),
            ("rollout ran in", summary.get("rollout", "-")),
            ("learning signal", self.signal.status or "-"),
            ("run dir", summary.get("run_dir", "-")),
            ("metrics", summary.get("metrics", "-")),
            ("final model", summary.get("final_model", "-")),
        ]
        if "sessions" in summary:  # mode=online: the ledger, opened == trained + dropped + in flight
            s = summary["sessions"]
            reasons = ", ".join(f"{k.partition('/')[2]} {v}" for k, v in sorted(s.items()) if k.startswith("dropped/"))
            rows.insert(7, ("sessions", f"{s.get('opened', 0)} opened = {s.get('trained', 0)} trained + "
                                        f"{s.get('dropped', 0)} dropped{f' ({reasons})' if reasons else ''} + "
                                        f"{s.get('in_flight', 0)} in flight"))
        return rows + [("plot", path) for path in summary.get("plots", [])]
