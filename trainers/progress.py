"""What the user sees during ``areal-agents run``: a live progress bar and a final summary."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from areal_agents.config import ExperimentConfig

__all__ = ["RunDisplay"]


def _fmt(value: Any, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


class _StatsColumn(ProgressColumn):
    """The ``stats`` field of a task; tasks added by others (eval) have none."""

    def render(self, task: Task) -> Text:
        return Text(str(task.fields.get("stats", "")))


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
        self._task: Any = None
        self._accuracy: Any = None
        self._started = False

    def start(self, total: int, done: int = 0) -> None:
        if not self._started:
            self.progress.start()
            self._started = True
        self._task = self.progress.add_task("RL", total=total, completed=done, stats="")

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        self._accuracy = metrics.get("eval/accuracy", self._accuracy)
        stats = (f"reward {_fmt(metrics.get('rollout/reward'))} | eval acc {_fmt(self._accuracy, '.2f')} | "
                 f"stale {_fmt(metrics.get('staleness/mean'), '.2f')} | "
                 f"{_fmt(metrics.get('perf/gen_tokens_per_s'), '.0f')} gen tok/s")
        if self._task is not None:
            self.progress.update(self._task, completed=step, stats=stats)

    def note(self, text: str) -> None:
        self.progress.console.print(f"[dim]{text}[/dim]")

    def stop(self) -> None:
        if self._started:
            self.progress.stop()
            self._started = False

    def summary(self, summary: dict[str, Any]) -> None:
        table = Table(title="areal-agents run", title_justify="left", show_header=False)
        table.add_column("", style="bold")
        table.add_column("")
        rows = [
            ("env / algorithm", f"{self.cfg.env.name} / {self.cfg.algorithm.name}"),
            ("steps (weight version)", f"{summary.get('steps', '-')} ({summary.get('version', '-')})"),
            ("eval accuracy before RL", _fmt(summary.get("accuracy_before"), ".3f")),
            ("eval accuracy after RL", _fmt(summary.get("accuracy_after"), ".3f")),
            ("wall time", f"{_fmt(summary.get('wall_time_s'), '.1f')} s"),
            ("generation throughput", f"{_fmt(summary.get('gen_tokens_per_s'), '.0f')} tokens/s"),
            ("run dir", summary.get("run_dir", "-")),
            ("metrics", summary.get("metrics", "-")),
            ("final model", summary.get("final_model", "-")),
        ]
        for path in summary.get("plots", []):
            rows.append(("plot", path))
        for key, value in rows:
            table.add_row(key, str(value))
        self.console.print(table)
