"""Wiring from config to episodes: env factory, agent, per-episode LLM, and evaluation.

Shared by the RL loop, rollout-only mode and ``areal-agents eval``; no torch here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from areal_agents._failures import EpisodesFailed, failure_message
from areal_agents.config import ExperimentConfig
from areal_agents.registry import agents, envs
from areal_agents.types import Trajectory

__all__ = ["build_agent", "build_episode_fn", "env_factory", "episode_solved", "evaluate", "sampling_params"]

EpisodeFn = Callable[[dict[str, Any], int, str], Awaitable[Trajectory]]


def sampling_params(cfg: ExperimentConfig, *, greedy: bool = False, temperature: float | None = None) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one LLM turn."""
    s = cfg.sampling
    params: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature,
                              "top_p": s.top_p, "top_k": s.top_k}
    if s.stop:
        params["stop"] = list(s.stop)
    if temperature is not None:
        params["temperature"] = temperature
    if greedy:
        params.update(temperature=0.0, top_p=1.0, top_k=-1)
    return params


def env_factory(cfg: ExperimentConfig) -> Callable[[], Any]:
    """A zero-argument constructor of the configured env."""
    env_cls = envs.get(cfg.env.name)
    kwargs = dict(cfg.env.kwargs)
    return lambda: env_cls(**kwargs)


def build_agent(cfg: ExperimentConfig, sampling: dict[str, Any]) -> Any:
    """The configured agent; the built-in ``ChatAgent`` gets the ``agent.*`` fields."""
    agent_cls = agents.get(cfg.agent.name)
    kwargs: dict[str, Any] = dict(
        max_turns=cfg.agent.max_turns, max_tokens=cfg.agent.max_tokens, system_prompt=cfg.agent.system_prompt,
        turn_discount=cfg.env.turn_discount, sampling=sampling,
    )
    kwargs.update(cfg.agent.kwargs)
    return agent_cls(**kwargs)


def build_episode_fn(cfg: ExperimentConfig, tokenizer: Any, client: Any, *, sampling: dict[str, Any]) -> EpisodeFn:
    """``episode_fn(row, seed, episode_id) -> Trajectory`` over the inference client."""
    from areal_agents.inference.llm_client import ClientLLM
    from areal_agents.rollout import make_episode_fn

    agent = build_agent(cfg, sampling)

    def llm_factory(episode_id: str) -> ClientLLM:
        return ClientLLM(tokenizer, client, rid=episode_id, default_sampling=sampling)

    fn: EpisodeFn = make_episode_fn(env_factory(cfg), agent, llm_factory,
                                    episode_timeout=cfg.rollout.episode_timeout)
    return fn


def episode_solved(traj: Trajectory) -> bool:
    """Whether an episode counts as solved: it finished (``status == "ok"``) and its final
    ``info["success"]`` is true, or, when the env reported none, its return is positive."""
    if traj.status != "ok":
        return False
    success = traj.info.get("success")
    return bool(success) if success is not None else traj.reward > 0


async def evaluate(cfg: ExperimentConfig, tokenizer: Any, client: Any, rows: Sequence[dict[str, Any]], *,
                   k: int = 1, temperature: float = 1.0, concurrency: int = 64,
                   progress: Any = None) -> dict[str, Any]:
    """Greedy accuracy (and pass@k when ``k > 1``) over ``rows``.

    An episode counts as solved as :func:`episode_solved` says. When every greedy episode
    failed, raises :class:`~areal_agents.rollout.EpisodesFailed` with the cause.
    """
    greedy_fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg, greedy=True))
    sem = asyncio.Semaphore(concurrency)
    task_id = progress.add_task("eval", total=len(rows) * (1 + (k if k > 1 else 0))) if progress else None

    async def one(fn: EpisodeFn, row: dict[str, Any], seed: int) -> Trajectory:
        async with sem:
            traj = await fn(row, seed, f"eval-{uuid.uuid4().hex[:12]}")
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
    if k > 1:
        sample_fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg, temperature=temperature))
        samples = await asyncio.gather(*(one(sample_fn, row, 1000 * i + j)
                                         for i, row in enumerate(rows) for j in range(k)))
        hits = [any(episode_solved(t) for t in samples[i * k:(i + 1) * k]) for i in range(len(rows))]
        report[f"eval/pass@{k}"] = sum(hits) / max(1, len(rows))
    if progress is not None:
        progress.remove_task(task_id)
    return report
