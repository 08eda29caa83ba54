"""Episode functions for the rollout executor, and rollout-only mode (trajectories to JSONL).

Public names are re-exported by :mod:`areal_agents.rollout`.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_agents._failures import blame, describe
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from areal_agents.rollout import RolloutExecutor

__all__ = ["EpisodeFn", "classify_error", "episode_outcome", "make_episode_fn", "write_rollouts"]

EpisodeFn = Callable[[dict[str, Any], int, str], Awaitable[Trajectory]]
"""``async episode_fn(row, seed, episode_id) -> Trajectory``."""

_SERVER_ERROR_MODULES = ("aiohttp", "httpx", "areal_agents.inference")


def classify_error(exc: BaseException) -> str:
    """Trajectory status for an exception escaping an episode.

    Timeouts give ``timeout``; connection problems and errors raised by the HTTP client
    libraries or the inference client give ``server_error``; anything else is the env's
    fault, ``env_error`` (:func:`make_episode_fn` tells the env's and the agent's apart).
    """
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "timeout"
    if isinstance(exc, ConnectionError):
        return "server_error"
    for cls in type(exc).__mro__:
        if cls.__module__.startswith(_SERVER_ERROR_MODULES):
            return "server_error"
    return "env_error"


def _failed(status: str, exc: BaseException | str) -> Trajectory:
    msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return Trajectory(status=status, info={"error": msg})


def episode_outcome(task: asyncio.Future[Any], cancel_reason: str, turn_discount: float | None) -> Trajectory:
    """The trajectory of a finished episode task, whatever happened to it.

    A cancelled task gives ``timeout`` (``cancel_reason == "timeout"``) or ``aborted``; an
    exception is classified by :func:`classify_error`; an ``ok`` result that fails
    :meth:`Trajectory.validate` becomes ``env_error``. With ``turn_discount`` the return is
    recomputed from the per-turn rewards.
    """
    if task.cancelled():
        status = "timeout" if cancel_reason == "timeout" else "aborted"
        return Trajectory(status=status, info={"error": f"episode cancelled ({cancel_reason or 'cancelled'})"})
    exc = task.exception()
    if exc is not None:
        return _failed(classify_error(exc), exc)
    traj = task.result()
    if not isinstance(traj, Trajectory):
        return _failed("env_error", f"episode_fn returned {type(traj).__name__}, not Trajectory")
    if cancel_reason and traj.ok:  # the episode swallowed its cancellation
        traj.status = "timeout" if cancel_reason == "timeout" else "aborted"
    if traj.ok:
        try:
            if turn_discount is not None and traj.turn_rewards:
                traj.set_rewards(traj.turn_rewards, turn_discount)
            traj.validate()
        except ValueError as exc:  # the agent builds the trajectory
            traj.status, traj.info["error"] = "agent_error", f"invalid trajectory: {exc}"
    return traj


def make_episode_fn(
    env_factory: Callable[[], Any],
    agent: Any,
    llm_factory: Callable[[str], Any],
    *,
    episode_timeout: float | None = None,
) -> EpisodeFn:
    """``episode_fn(row, seed, episode_id)``: a fresh env, ``agent.run(env, llm)``, env closed.

    ``agent.run(env, llm, row, seed=seed)`` resets the env with ``options=row`` and
    ``seed`` and plays it; ``llm = llm_factory(episode_id)``. Exceptions never escape: they
    become a :class:`Trajectory` with status ``env_error`` or ``agent_error`` (whose code
    raised, with its file and line), ``server_error`` or ``timeout`` (after ``episode_timeout``
    seconds) and the error text in ``info["error"]``. Cancellation propagates, after closing the env.
    """
    async def play(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        env = env_factory()
        try:
            llm = llm_factory(episode_id)
            try:
                traj = await agent.run(env, llm, row, seed=seed)
            except Exception as exc:
                status = classify_error(exc)
                if status != "env_error":
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
        try:
            if episode_timeout is None:
                return await play(row, seed, episode_id)
            return await asyncio.wait_for(play(row, seed, episode_id), episode_timeout)
        except asyncio.TimeoutError as exc:
            return _failed("timeout", f"episode exceeded {episode_timeout} s" if episode_timeout else exc)
        except Exception as exc:
            return _failed(classify_error(exc), exc)
        except SystemExit as exc:  # an env calling sys.exit() must not stop the rollout event loop
            return _failed("env_error", f"SystemExit({exc.code!r}) raised in the episode")

    return episode_fn


def write_rollouts(executor: RolloutExecutor, n: int, path: str | os.PathLike[str], *,
                   progress: bool = True, timeout: float | None = None) -> dict[str, Any]:
    """Rollout-only mode: write ``n`` episodes (rounded up to whole groups) as Trajectory JSONL.

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
        with open(out, "w", encoding="utf-8") as fh, _progress_bar(progress) as bar:
            task = bar.add_task(f"rollouts → {out.name}", total=n_groups * group_size) if bar else None
            for _ in range(n_groups):
                (group,) = executor.wait(1, timeout)
                data = "".join(t.to_json() + "\n" for t in group)
                fh.write(data)
                fh.flush()
                complete_bytes += len(data.encode("utf-8"))
                written += len(group)
                if bar is not None and task is not None:
                    bar.update(task, advance=len(group))
    except OSError:  # e.g. a full disk: drop the torn tail so the file stays a valid prefix
        with open(out, "r+b") as raw:
            raw.truncate(complete_bytes)
        raise
    finally:
        executor.bounded_staleness = bounded
    return {"path": str(out), "episodes": written, "groups": n_groups, "seconds": time.monotonic() - t0}


class _NoBar:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _progress_bar(enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
