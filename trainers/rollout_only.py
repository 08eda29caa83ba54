"""Rollout-only mode (``mode=rollout``): episodes written to a Trajectory JSONL file."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from areal_agents.rollout import Rollout

__all__ = ["write_rollouts"]


def write_rollouts(executor: Rollout, n: int, path: str | os.PathLike[str], *,
                   progress: bool = True, timeout: float | None = None) -> dict[str, Any]:
    """Write ``n`` episodes (rounded up to whole groups) as Trajectory JSONL.

    Starts ``executor`` if needed and lifts its staleness bound meanwhile (the weights do not
    change, so only ``max_concurrent_rollouts`` limits it). Each line is
    ``Trajectory.to_json()``; groups are written as they finish, so an interrupted run leaves a
    valid prefix. Returns ``{"path", "episodes", "groups", "seconds"}``.
    """
    if n < 1:
        raise ValueError(f"number of episodes must be >= 1 (got {n})")
    group_size = executor.cfg.group_size
    n_groups = math.ceil(n / group_size)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not executor.running:
        executor.start()
    bounded, executor.bounded_staleness = executor.bounded_staleness, False
    t0 = time.monotonic()
    written = complete_bytes = 0
    try:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with open(out, "w", encoding="utf-8") as fh, Progress(*columns, disable=not progress) as bar:
            task = bar.add_task(f"rollouts → {out.name}", total=n_groups * group_size)
            for _ in range(n_groups):
                (group,) = executor.wait(1, timeout)
                data = "".join(t.to_json() + "\n" for t in group)
                fh.write(data)
                fh.flush()
                complete_bytes += len(data.encode("utf-8"))
                written += len(group)
                bar.update(task, advance=len(group))
    except OSError:  # e.g. a full disk: drop the torn tail so the file stays a valid prefix
        with open(out, "r+b") as raw:
            raw.truncate(complete_bytes)
        raise
    finally:
        executor.bounded_staleness = bounded
    return {"path": str(out), "episodes": written, "groups": n_groups, "seconds": time.monotonic() - t0}
