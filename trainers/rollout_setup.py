"""The rollout a training run drives: its process started beside the inference servers, then its
executor (or an online run's gateway) built for their addresses."""

from __future__ import annotations

import contextlib
from typing import Any

from areal_agents.config import ExperimentConfig
from areal_agents.online.rollout import build_online_rollout
from areal_agents.rollout import Rollout
from areal_agents.rollout.process import RolloutChild, RolloutProcess, build_executor, registrations, start_child
from trainers.progress import RunDisplay

__all__ = ["rollout_executor", "start_rollout_child"]


def start_rollout_child(cfg: ExperimentConfig, stack: contextlib.ExitStack) -> RolloutChild | None:
    """The rollout process of a training run (``rollout.process``; ``mode`` full or online),
    started while the servers load (it imports what its build needs meanwhile); closed with
    ``stack`` if no rollout takes it. None for other runs."""
    if not (cfg.rollout.process and cfg.mode in ("full", "online")):
        return None
    child = start_child()
    stack.callback(_close, child)
    return child


def _close(child: RolloutChild) -> None:
    """The end of a child that no rollout took (one that did was shut down with its rollout)."""
    proc, conn = child
    conn.close()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def rollout_executor(cfg: ExperimentConfig, addresses: list[str], model_path: str, tokenizer: Any,
                     display: RunDisplay, child: RolloutChild | None) -> Rollout:
    """The rollout: the executor over the dataset, or the gateway of an online run
    (``mode=online``); in ``child`` (:func:`start_rollout_child`) unless a registration cannot be
    sent there; on a thread of this process otherwise."""
    build = build_online_rollout if cfg.mode == "online" else build_executor
    if child is not None:
        try:
            blob = registrations(cfg)
        except ValueError as exc:
            display.note(f"rollout runs on a thread of the trainer: {exc}")
        else:
            return RolloutProcess(cfg, addresses, model_path, registrations_blob=blob, build=build, child=child)
    return build(cfg, addresses, model_path, tokenizer)
