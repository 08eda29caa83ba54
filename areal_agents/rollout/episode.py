"""One episode: the episode function, its deadline, its outcome, and its wiring from config.

``EpisodeFn`` is ``async episode_fn(row, seed, episode_id) -> Trajectory``. :func:`make_episode_fn`
builds the usual one (a fresh env, ``agent.run(env, llm)``, env closed, errors to statuses);
:func:`build_episode_fn` builds it from an :class:`~areal_agents.config.ExperimentConfig` over
the inference client (shared by the RL loop, rollout-only mode and ``areal-agents eval``);
:func:`with_deadline` is the one episode deadline; :func:`evaluate` measures greedy accuracy
and pass@k. No torch here.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.failures import EpisodesFailed, blame, describe, failure_message
from areal_agents.registry import agents, envs
from areal_agents.rollout.returns import settle_returns
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from rich.progress import Progress

    from areal_agents.agent import Agent
    from areal_agents.env import Env
    from areal_agents.inference.client import InferenceClient
    from areal_agents.llm import LLM

__all__ = ["EpisodeFn", "build_agent", "build_episode_fn", "classify_error", "env_factory", "episode_outcome",
           "episode_solved", "evaluate", "make_episode_fn", "run_eval", "sampling_params", "with_deadline"]

log = logging.getLogger("areal_agents.rollout")

EpisodeFn = Callable[[dict[str, Any], int, str], Awaitable[Trajectory]]
"""``async episode_fn(row, seed, episode_id) -> Trajectory``."""

ABANDON_AFTER = 5.0
"""Seconds an episode may ignore its cancellation before it is abandoned (at most its timeout)."""

_SERVER_ERROR_MODULES = ("aiohttp", "httpx", "areal_agents.inference")


def classify_error(exc: BaseException) -> str:
    """Trajectory status for an exception escaping an episode.

    Timeouts give ``timeout``; connection problems and errors raised by the HTTP client
    libraries or the inference client give ``server_error``; anything else is the env's
    fault, ``env_error`` (:func:`make_episode_fn` tells the env's and the agent's apart).
    """
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "timeout"
    if isinstance(exc, ConnectionError) or any(cls.__module__.startswith(_SERVER_ERROR_MODULES)
                                               for cls in type(exc).__mro__):
        return "server_error"
    return "env_error"


def _failed(status: str, exc: BaseException | str) -> Trajectory:
    msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return Trajectory(status=status, info={"error": msg})


async def with_deadline(episode: Awaitable[Trajectory], timeout: float) -> Trajectory:
    """Await ``episode`` for at most ``timeout`` seconds: the one episode deadline.

    Past it the episode is cancelled (its ``finally`` blocks close the env) and becomes a
    ``timeout`` trajectory; one that ignores its cancellation (a catch-all retry loop in an async
    env) for ``min(5, timeout)`` s more is abandoned, so it cannot hold its group or its slot
    forever. Cancelling the caller cancels the episode and waits as long for it.
    """
    task = asyncio.ensure_future(episode)
    grace = min(ABANDON_AFTER, timeout)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if done:
            return task.result()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=grace)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task}, timeout=grace)
        raise
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a late error is not "never retrieved"
    if done:
        return _failed("timeout", f"episode exceeded {timeout} s")
    log.warning("rollout: an episode ignored its cancellation after %s s; counted as a timeout", timeout)
    return _failed("timeout", f"episode exceeded {timeout} s and ignored its cancellation")


def episode_outcome(task: asyncio.Future[Trajectory], cancel_reason: str, turn_discount: float = 1.0,
                    failure_policy: str = "drop") -> Trajectory:
    """The trajectory of a finished episode task, whatever happened to it, its return settled.

    A cancelled task gives ``aborted``; an exception is classified by :func:`classify_error`;
    an ``ok`` result that fails :meth:`Trajectory.validate` becomes ``agent_error``. The return
    comes from the per-turn rewards by :func:`~areal_agents.rollout.returns.settle_returns`
    (``turn_discount``; under ``failure_policy="zero"`` a failed episode's rewards are 0).
    """
    if task.cancelled():
        traj = _failed("aborted", f"episode cancelled ({cancel_reason or 'cancelled'})")
    elif (exc := task.exception()) is not None:
        traj = _failed(classify_error(exc), exc)
    elif not isinstance(traj := task.result(), Trajectory):
        traj = _failed("env_error", f"episode_fn returned {type(traj).__name__}, not Trajectory")
    elif traj.ok:
        try:
            traj.validate()
        except ValueError as exc:  # the agent builds the trajectory
            traj.status, traj.info["error"] = "agent_error", f"invalid trajectory: {exc}"
    return settle_returns(traj, turn_discount, zero_failed=failure_policy == "zero")


def make_episode_fn(
    env_factory: Callable[[], Env],
    agent: Agent,
    llm_factory: Callable[[str], LLM],
    *,
    episode_timeout: float | None = None,
) -> EpisodeFn:
    """``episode_fn(row, seed, episode_id)``: a fresh env, ``agent.run(env, llm)``, env closed.

    ``agent.run(env, llm, row, seed=seed)`` resets the env with ``options=row`` and
    ``seed`` and plays it; ``llm = llm_factory(episode_id)``. Exceptions never escape: they
    become a :class:`Trajectory` with status ``env_error`` or ``agent_error`` (whose code
    raised, with its file and line), ``server_error`` or ``timeout`` (after ``episode_timeout``
    seconds, by :func:`with_deadline`; the executor applies its own ``rollout.episode_timeout``)
    and the error text in ``info["error"]``. Cancellation propagates, after closing the env.
    """
    async def play(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        env = env_factory()
        try:
            llm = llm_factory(episode_id)
            try:
                traj = await agent.run(env, llm, row, seed=seed)
            except Exception as exc:
                if (status := classify_error(exc)) != "env_error":
                    return _failed(status, exc)
                return _failed(blame(exc, env, agent), describe(exc))
        finally:
            close = getattr(env, "close", None)
            if close is not None:
                close()
        if not isinstance(traj, Trajectory):
            return _failed("agent_error", f"{type(agent).__name__}.run returned {type(traj).__name__}, not Trajectory")
        return traj

    async def episode_fn(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        episode = play(row, seed, episode_id)
        try:
            return await (episode if episode_timeout is None else with_deadline(episode, episode_timeout))
        except Exception as exc:
            return _failed(classify_error(exc), exc)
        except SystemExit as exc:  # an env calling sys.exit() must not stop the rollout event loop
            return _failed("env_error", f"SystemExit({exc.code!r}) raised in the episode")

    return episode_fn


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


def env_factory(cfg: ExperimentConfig) -> Callable[[], Env]:
    """A zero-argument constructor of the configured env."""
    return functools.partial(envs.get(cfg.env.name), **cfg.env.kwargs)


def build_agent(cfg: ExperimentConfig, sampling: dict[str, Any]) -> Agent:
    """The configured agent; the built-in ``ChatAgent`` gets the ``agent.*`` fields, an OpenAI-style
    agent (``async def agent(client, row)``, :mod:`areal_agents.openai_compat.agent`) is wrapped."""
    agent_cls = agents.get(cfg.agent.name)
    from areal_agents.openai_compat.agent import OpenAIAgent, is_openai_agent

    if is_openai_agent(agent_cls):  # async def agent(client, row), written against the OpenAI client
        fn: Any = agent_cls(**cfg.agent.kwargs) if inspect.isclass(agent_cls) else agent_cls  # a class: with kwargs
        return OpenAIAgent(fn, turn_discount=cfg.env.turn_discount, sampling=sampling,
                           trajectory_mode=cfg.agent.trajectory_mode)
    if cfg.agent.trajectory_mode is not None:
        raise ConfigError("agent.trajectory_mode", f"applies to OpenAI-style agents (async def agent(client, row)); "
                                                   f"{cfg.agent.name!r} is not one")
    return agent_cls(**{"max_turns": cfg.agent.max_turns, "max_tokens": cfg.agent.max_tokens,
                        "system_prompt": cfg.agent.system_prompt, "turn_discount": cfg.env.turn_discount,
                        "sampling": sampling, **cfg.agent.kwargs})


def build_episode_fn(cfg: ExperimentConfig, tokenizer: Any, client: InferenceClient, *, sampling: dict[str, Any],
                     episode_timeout: float | None = None) -> EpisodeFn:
    """``episode_fn(row, seed, episode_id) -> Trajectory`` over the inference client.

    ``episode_timeout`` is for episodes run outside a :class:`~areal_agents.rollout.RolloutExecutor`
    (which times its episodes out itself).
    """
    from areal_agents.llm import ClientLLM

    llm_factory = functools.partial(ClientLLM, tokenizer, client, default_sampling=sampling)  # (rid) -> ClientLLM
    return make_episode_fn(env_factory(cfg), build_agent(cfg, sampling), llm_factory, episode_timeout=episode_timeout)


def episode_solved(traj: Trajectory) -> bool:
    """Whether an episode counts as solved: it finished (``status == "ok"``) and its final
    ``info["success"]`` is true, or, when the env reported none, its return is positive."""
    if traj.status != "ok":
        return False
    success = traj.info.get("success")
    return bool(success) if success is not None else traj.reward > 0


async def evaluate(cfg: ExperimentConfig, tokenizer: Any, client: InferenceClient, rows: Sequence[dict[str, Any]], *,
                   k: int = 1, temperature: float = 1.0, concurrency: int = 64,
                   progress: Progress | None = None) -> dict[str, Any]:
    """Greedy accuracy (and pass@k when ``k > 1``) over ``rows``.

    An episode counts as solved as :func:`episode_solved` says. When every greedy episode
    failed, raises :class:`~areal_agents.rollout.EpisodesFailed` with the cause.
    """
    timeout = cfg.rollout.episode_timeout
    greedy_fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg, greedy=True),
                                 episode_timeout=timeout)
    sem = asyncio.Semaphore(concurrency)
    task_id = progress.add_task("eval", total=len(rows) * (1 + (k if k > 1 else 0))) if progress else None

    async def one(fn: EpisodeFn, row: dict[str, Any], seed: int) -> Trajectory:
        async with sem:
            traj = settle_returns(await fn(row, seed, f"eval-{uuid.uuid4().hex[:12]}"), cfg.env.turn_discount)
        if progress is not None and task_id is not None:
            progress.advance(task_id)
        return traj

    greedy = await asyncio.gather(*(one(greedy_fn, row, i) for i, row in enumerate(rows)))
    if greedy and all(t.status != "ok" for t in greedy):  # nothing was measured: say why, do not go on
        if progress is not None and task_id is not None:
            progress.remove_task(task_id)
        raise EpisodesFailed(failure_message(f"eval: all {len(greedy)} episodes failed", greedy[-1]))
    report: dict[str, Any] = {
        "eval/accuracy": sum(map(episode_solved, greedy)) / max(1, len(rows)),
        "eval/reward": sum(t.reward for t in greedy) / max(1, len(rows)),
        "eval/failed": sum(t.status != "ok" for t in greedy),
        "eval/n": len(rows),
    }
    if k > 1:
        sample_fn = build_episode_fn(cfg, tokenizer, client, sampling=sampling_params(cfg, temperature=temperature),
                                     episode_timeout=timeout)
        samples = await asyncio.gather(*(one(sample_fn, row, 1000 * i + j)
                                         for i, row in enumerate(rows) for j in range(k)))
        hits = [any(episode_solved(t) for t in samples[i * k:(i + 1) * k]) for i in range(len(rows))]
        report[f"eval/pass@{k}"] = sum(hits) / max(1, len(rows))
    if progress is not None and task_id is not None:
        progress.remove_task(task_id)
    return report


def run_eval(cfg: ExperimentConfig, tokenizer: Any, addresses: list[str], rows: list[dict[str, Any]],
             progress: Progress | None = None, lora_path: str | None = None) -> dict[str, Any]:
    """Greedy (and pass@k) accuracy on ``rows`` with a client of its own (decoding with the
    loaded adapter ``lora_path`` when given), and its duration (``time/eval_s``, so that
    training time can be told from eval time)."""
    from areal_agents.inference.client import InferenceClient

    async def go() -> dict[str, Any]:
        client = InferenceClient(addresses, timeout=cfg.inference.request_timeout, lora_path=lora_path,
                                 batch_window=cfg.inference.batch_window)
        try:
            return await evaluate(cfg, tokenizer, client, rows, k=cfg.eval.k, temperature=cfg.eval.temperature,
                                  progress=progress)
        finally:
            await client.aclose()

    if not rows:
        return {}
    t0 = time.monotonic()
    return {**asyncio.run(go()), "time/eval_s": time.monotonic() - t0}
