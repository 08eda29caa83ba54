"""The warm start's check for a multi-turn env: greedy episodes through the env, as the eval plays them.

A first-turn string match says little about a game or a tool call: a model can open every
episode right and still never finish one. So for an env of more than one turn the warm start
(:func:`trainers.sft.ensure_warm_model`) measures what the run's eval measures. The weights
being trained are exported to disk and loaded by an embedded server of the check's own
(``/update_weights_from_disk``, as the RL loop syncs), and
:func:`~areal_agents.rollout.evaluation.evaluate` plays the check rows with the configured agent,
env and greedy sampling, counting successes by the same rule
(:func:`~areal_agents.rollout.episode.episode_solved`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as tdist

from areal_agents.config import ExperimentConfig
from areal_agents.env import reference_conversation

if TYPE_CHECKING:
    from areal_agents.env import Env
    from trainers.engine import TrainEngine

__all__ = ["episode_check", "is_multi_turn"]


def is_multi_turn(cfg: ExperimentConfig, env: Env, row: dict[str, Any]) -> bool:
    """Whether an episode of ``env`` can take more than one reply (as far as the agent lets it),
    or is taught by a whole reference conversation (``row`` stands for the env's rows)."""
    turns = min(int(getattr(env, "max_turns", 1) or 1), cfg.agent.max_turns)
    return turns > 1 or reference_conversation(env, row) is not None


@contextlib.contextmanager
def episode_check(cfg: ExperimentConfig, model_dir: str | Path, tokenizer: Any, rows: Sequence[dict[str, Any]],
                  work_dir: str | Path) -> Iterator[Callable[[TrainEngine], dict[str, float]]]:
    """``check(engine) -> {"acc": greedy success}`` on ``rows``, served from ``work_dir``.

    Collective (every rank calls ``check``): rank 0 starts one embedded server on
    ``model_dir`` when entered and stops it on exit; each check exports the engine's weights
    (every rank), rank 0 loads them into the server and plays the episodes, and the success rate
    is broadcast to every rank.
    """
    from areal_agents.inference.control import update_weights_from_disk
    from areal_agents.inference.launcher import launch_servers
    from areal_agents.rewards import RewardRunner
    from areal_agents.rollout.evaluation import run_eval

    work = Path(work_dir)
    main = not tdist.is_initialized() or tdist.get_rank() == 0
    served = dataclasses.replace(cfg, inference=dataclasses.replace(cfg.inference, backend="embedded", num_servers=1))
    version = 0
    with contextlib.ExitStack() as stack:
        addresses: list[str] = []
        rewards: RewardRunner | None = None
        if main:
            stack.callback(shutil.rmtree, work, ignore_errors=True)
            addresses = stack.enter_context(launch_servers(served, model_dir, 1, log_dir=work / "logs")).addresses
            rewards = stack.enter_context(RewardRunner.for_rollout(cfg.rollout))

        def check(engine: TrainEngine) -> dict[str, float]:
            nonlocal version
            version += 1
            path = engine.export_hf(work / f"weights-{version}", durable=False)
            result = [0.0]
            if main:
                update_weights_from_disk(addresses, str(path), version)
                shutil.rmtree(path, ignore_errors=True)  # the server has read it
                result[0] = float(run_eval(served, tokenizer, addresses, list(rows), reward_runner=rewards)["eval/accuracy"])
            if tdist.is_initialized() and tdist.get_world_size() > 1:
                tdist.broadcast_object_list(result, src=0)
            return {"acc": result[0]}

        yield check
