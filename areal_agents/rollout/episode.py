"""One episode: the episode function, its deadline and its outcome.

``EpisodeFn`` is ``async episode_fn(row, seed, episode_id) -> Trajectory``. :func:`make_episode_fn`
builds the usual one (a fresh env, ``agent.run(env, llm)``, env closed, errors to statuses);
:func:`with_deadline` is the one episode deadline; :func:`episode_outcome` turns a finished (or
cancelled) episode into its trajectory, returns settled; :func:`episode_solved` says whether it
counts as solved. Built from config in :mod:`areal_agents.rollout.wiring`; evaluated in
:mod:`areal_agents.rollout.evaluation`. No torch here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from areal_agents.failures import blame, describe
from areal_agents.rollout.returns import settle_returns
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from areal_agents.agent import Agent
    from areal_agents.env import Env
    from areal_agents.llm import LLM

__all__ = ["EpisodeFn", "classify_error", "episode_outcome", "episode_solved", "make_episode_fn", "with_deadline"]

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
        if getattr(env, "reward_seconds", 0.0) or getattr(env, "judge_calls", 0):  # what its rewards cost
            traj.info["reward_s"], traj.info["judge_calls"] = env.reward_seconds, env.judge_calls  # type: ignore[attr-defined]
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


def episode_solved(traj: Trajectory) -> bool:
    """Whether an episode counts as solved: it finished (``status == "ok"``) and its final
    ``info["success"]`` is true, or, when the env reported none, its return is positive."""
    if traj.status != "ok":
        return False
    success = traj.info.get("success")
    return bool(success) if success is not None else traj.reward > 0
