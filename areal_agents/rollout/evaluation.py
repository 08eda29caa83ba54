"""Evaluation: greedy accuracy and pass@k of the configured env and agent over an inference client.

:func:`evaluate` plays the rows (an episode counts as solved as
:func:`~areal_agents.rollout.episode.episode_solved` says); :func:`run_eval` does so with a client
of its own (:func:`~areal_agents.rollout.wiring.inference_client`) for the RL loop's evals, the
warm check and ``areal-agents eval``. No torch here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from areal_agents.config import ExperimentConfig
from areal_agents.failures import EpisodesFailed, failure_message
from areal_agents.rollout.episode import EpisodeFn, episode_solved
from areal_agents.rollout.returns import settle_returns
from areal_agents.rollout.wiring import build_episode_fn, inference_client, sampling_params
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from areal_agents.rewards import RewardRunner

__all__ = ["evaluate", "run_eval"]


async def evaluate(cfg: ExperimentConfig, tokenizer: Any, client: Any, rows: Sequence[dict[str, Any]], *,
                   k: int = 1, temperature: float = 1.0, concurrency: int = 64,
                   progress: Any = None, reward_runner: RewardRunner | None = None) -> dict[str, Any]:
    """Greedy accuracy (and pass@k when ``k > 1``) over ``rows`` (the envs' rewards in ``reward_runner``).

    An episode counts as solved as :func:`episode_solved` says. When every greedy episode
    failed, raises :class:`~areal_agents.rollout.EpisodesFailed` with the cause. The envs take
    ``env.kwargs`` updated with ``eval.env_kwargs`` (an eval may score by a truth the run does not
    train on).
    """
    if cfg.eval.env_kwargs:
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, kwargs={**cfg.env.kwargs, **cfg.eval.env_kwargs}))
    timeout = cfg.rollout.episode_timeout
    greedy_fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg, greedy=True),
                                 episode_timeout=timeout, reward_runner=reward_runner)
    sem = asyncio.Semaphore(concurrency)
    task_id = progress.add_task("eval", total=len(rows) * (1 + (k if k > 1 else 0))) if progress else None

    async def one(fn: EpisodeFn, row: dict[str, Any], seed: int) -> Trajectory:
        async with sem:
            traj = settle_returns(await fn(row, seed, f"eval-{uuid.uuid4().hex[:12]}"), cfg.env.turn_discount)
        if progress is not None:
            progress.advance(task_id)
        return traj

    greedy = await asyncio.gather(*(one(greedy_fn, row, i) for i, row in enumerate(rows)))
    if greedy and all(t.status != "ok" for t in greedy):  # nothing was measured: say why, do not go on
        if progress is not None:
            progress.remove_task(task_id)
        raise EpisodesFailed(failure_message(f"eval: all {len(greedy)} episodes failed", greedy[-1]))
    report: dict[str, Any] = {
        "eval/accuracy": sum(map(episode_solved, greedy)) / max(1, len(rows)),
        "eval/reward": sum(t.reward for t in greedy) / max(1, len(rows)),
        "eval/failed": sum(t.status != "ok" for t in greedy),
        "eval/n": len(rows),
    }
    versions = [v for t in greedy for v in t.versions if v >= 0]
    if versions:  # the newest weights any of its tokens was decoded with
        report["eval/weight_version"] = max(versions)
    if k > 1:
        sample_fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg, temperature=temperature),
                                     episode_timeout=timeout, reward_runner=reward_runner)
        samples = await asyncio.gather(*(one(sample_fn, row, 1000 * i + j)
                                         for i, row in enumerate(rows) for j in range(k)))
        hits = [any(episode_solved(t) for t in samples[i * k:(i + 1) * k]) for i in range(len(rows))]
        report[f"eval/pass@{k}"] = sum(hits) / max(1, len(rows))
    if progress is not None:
        progress.remove_task(task_id)
    return report


def run_eval(cfg: ExperimentConfig, tokenizer: Any, addresses: list[str], rows: list[dict[str, Any]],
             progress: Any = None, lora_path: str | None = None, *,
             reward_runner: RewardRunner | None = None) -> dict[str, Any]:
    """Greedy (and pass@k) accuracy on ``rows`` with a client of its own (:func:`inference_client`,
    decoding with the loaded adapter ``lora_path`` when given; the envs' rewards in ``reward_runner``),
    and its duration (``time/eval_s``, so that training time can be told from eval time)."""

    # As many episodes at once as the servers decode together: each server's batch stays full.
    concurrency = max(64, cfg.inference.max_batch_size) * max(1, len(addresses))

    async def go() -> dict[str, Any]:
        client = inference_client(cfg, addresses, lora_path=lora_path)
        try:
            return await evaluate(cfg, tokenizer, client, rows, k=cfg.eval.k, temperature=cfg.eval.temperature,
                                  concurrency=concurrency, progress=progress, reward_runner=reward_runner)
        finally:
            await client.aclose()

    if not rows:
        return {}
    t0 = time.monotonic()
    return {**asyncio.run(go()), "time/eval_s": time.monotonic() - t0}
