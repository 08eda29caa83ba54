"""An episode's wiring from config: the env, the agent, the sampling, the inference client, the episode function.

:func:`build_episode_fn` builds the ``episode_fn`` of an :class:`~areal_agents.config.ExperimentConfig`
over an inference client (shared by the RL loop, rollout-only mode and ``areal-agents eval``);
:func:`inference_client` is the one builder of that client from config; :func:`env_factory` hands
the run's reward runner to every env it builds. No torch here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.registry import agents, envs
from areal_agents.rollout.episode import EpisodeFn, make_episode_fn

if TYPE_CHECKING:
    from areal_agents.inference.client import InferenceClient
    from areal_agents.rewards import RewardRunner

__all__ = ["build_agent", "build_episode_fn", "env_factory", "inference_client", "sampling_params"]


def sampling_params(cfg: ExperimentConfig, *, greedy: bool = False, temperature: float | None = None) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one LLM turn."""
    s = cfg.sampling
    params: dict[str, Any] = {"max_new_tokens": s.max_new_tokens,
                              "temperature": s.temperature if temperature is None else temperature,
                              "top_p": s.top_p, "top_k": s.top_k}
    if s.stop:
        params["stop"] = list(s.stop)
    if greedy:
        params.update(temperature=0.0, top_p=1.0, top_k=-1)
    return params


def env_factory(cfg: ExperimentConfig, reward_runner: RewardRunner | None = None) -> Callable[[], Any]:
    """A zero-argument constructor of the configured env; the env's rewards go to ``reward_runner``
    (its ``reward_runner`` attribute) when one is given."""
    factory = envs.get(cfg.env.name)
    if reward_runner is None:
        return functools.partial(factory, **cfg.env.kwargs)
    return functools.partial(_env_with_runner, factory, cfg.env.kwargs, reward_runner)


def _env_with_runner(factory: Callable[..., Any], kwargs: dict[str, Any], reward_runner: RewardRunner) -> Any:
    from areal_agents.env import RewardMixin

    env = factory(**kwargs)
    if isinstance(env, RewardMixin):
        env.reward_runner = reward_runner
    return env


def inference_client(cfg: ExperimentConfig, addresses: list[str], *, lora_path: str | None = None) -> InferenceClient:
    """The inference client of ``cfg.inference`` (schedule, request timeout and retries, batch window)
    for ``addresses``, decoding with the loaded adapter ``lora_path`` when given: rollout and
    evaluation build their clients here."""
    from areal_agents.inference.client import InferenceClient

    inf = cfg.inference
    return InferenceClient(addresses, schedule=inf.schedule, timeout=inf.request_timeout, retries=inf.request_retries,
                           lora_path=lora_path, batch_window=inf.batch_window,
                           stream_batches=inf.backend == "embedded")


def build_agent(cfg: ExperimentConfig, sampling: dict[str, Any]) -> Any:
    """The configured agent; an :class:`~areal_agents.agent.Agent` class (``ChatAgent`` or a user's)
    is built with ``max_turns``, ``max_tokens``, ``system_prompt`` (the ``agent.*`` fields), ``sampling``
    and ``agent.kwargs``, an OpenAI-style agent (``async def agent(client, row)``,
    :mod:`areal_agents.openai_compat.agent`) is wrapped. No agent is given the turn discount: the
    rollout settles returns with ``env.turn_discount`` (:func:`~areal_agents.rollout.returns.settle_returns`)."""
    agent_cls = agents.get(cfg.agent.name)
    from areal_agents.openai_compat.agent import OpenAIAgent, is_openai_agent

    if is_openai_agent(agent_cls):  # async def agent(client, row), written against the OpenAI client
        fn: Any = agent_cls(**cfg.agent.kwargs) if inspect.isclass(agent_cls) else agent_cls  # a class: with kwargs
        return OpenAIAgent(fn, sampling=sampling, trajectory_mode=cfg.agent.trajectory_mode)
    if cfg.agent.trajectory_mode is not None:
        raise ConfigError("agent.trajectory_mode", f"applies to OpenAI-style agents (async def agent(client, row)); "
                                                   f"{cfg.agent.name!r} is not one")
    return agent_cls(**{"max_turns": cfg.agent.max_turns, "max_tokens": cfg.agent.max_tokens,
                        "system_prompt": cfg.agent.system_prompt, "sampling": sampling, **cfg.agent.kwargs})


def build_episode_fn(cfg: ExperimentConfig, tokenizer: Any, client: Any, *, sampling: dict[str, Any],
                     episode_timeout: float | None = None, reward_runner: RewardRunner | None = None) -> EpisodeFn:
    """``episode_fn(row, seed, episode_id) -> Trajectory`` over the inference client.

    ``episode_timeout`` is for episodes run outside a :class:`~areal_agents.rollout.RolloutExecutor`
    (which times its episodes out itself); the envs' rewards go to ``reward_runner`` (see :func:`env_factory`).
    """
    from areal_agents.llm import ClientLLM

    llm_factory = functools.partial(ClientLLM, tokenizer, client, default_sampling=sampling)  # (rid) -> ClientLLM
    return make_episode_fn(env_factory(cfg, reward_runner), build_agent(cfg, sampling), llm_factory,
                           episode_timeout=episode_timeout)
