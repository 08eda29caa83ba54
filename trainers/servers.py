"""Inference servers for a run: launched (embedded / SGLang) or attached (remote)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from areal_agents.config import ExperimentConfig
from areal_agents.inference.control import wait_healthy
from areal_agents.inference.launcher import launch_servers

__all__ = ["inference_servers"]


@contextlib.contextmanager
def inference_servers(cfg: ExperimentConfig, model_path: str, log_dir: str | Path | None = None) -> Iterator[list[str]]:
    """Yield ``host:port`` addresses of healthy servers; launched ones are stopped on exit.

    ``inference.backend=remote`` attaches to ``inference.addresses`` (waiting for their
    ``/health``) and leaves them running.
    """
    if cfg.inference.backend == "remote":
        wait_healthy(list(cfg.inference.addresses), timeout=cfg.inference.setup_timeout)
        yield list(cfg.inference.addresses)
        return
    logs = Path(log_dir) if log_dir is not None else Path(cfg.run_dir) / "logs"
    with launch_servers(cfg, model_path, log_dir=logs) as group:
        yield group.addresses
