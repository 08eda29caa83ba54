"""Check the user's env, reward and agent in seconds, before a run builds a model or starts a server.

``areal-agents run`` calls :func:`preflight` once, before it hands the run to the trainer (a
rank that ``torchrun`` or Ray started skips it: its launcher checked). On one row of the
training data it builds the env, resets and steps it with the env's reference completion (which calls its reward),
runs :func:`~areal_agents.gym.checker.check_env`, then builds the agent and plays one episode against a
:class:`~areal_agents.llm.scripted.ScriptedLLM` (a scripted model with a character tokenizer: the
agent's code runs, no model does). A failure is a :class:`PreflightError` whose one-line
message names the component, the cause and the line of the user's code, e.g.
``reward 'exact' returned str '0.0', not a number (my_rewards.py:12)``; the original exception
is chained to it, so ``AREAL_AGENTS_TRACEBACK=1`` shows the whole traceback. A run that warm-starts
the tiny default model (no ``actor.path``) also checks that the env's reference games fit in
``agent.max_turns`` (:func:`check_reference_turns`, a :class:`~areal_agents.config.ConfigError`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.data import load_dataset_rows
from areal_agents.env import reference_completion, reference_conversation
from areal_agents.failures import UserError, blame, describe, failure_cause, function_location
from areal_agents.gym.checker import EnvCheckError, check_env, probe_actions
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.registry import agents, envs
from areal_agents.rewards import RewardRunner
from areal_agents.rewards.judge import NOT_SERVED_YET
from areal_agents.rewards.worker import check_not_in_worker
from areal_agents.rollout.wiring import build_agent, env_factory, sampling_params
from areal_agents.types import Trajectory

__all__ = ["REFERENCE_CHECK_ROWS", "PreflightError", "check_reference_turns", "preflight", "reference_turns"]

T = TypeVar("T")
REFERENCE_CHECK_ROWS = 1000  # the rows whose reference games check_reference_turns reads


class PreflightError(UserError):
    """The user's env, agent or reward failed the checks before the run; the message names it."""

    names_its_cause = True  # the command line prints the message alone


def _call(what: str, fn: Callable[..., T], *args: Any, fallback: Any = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``; an exception becomes a PreflightError ``{what} raised Type: msg (file:line)``."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises, one line
        raise PreflightError(f"{what} raised {describe(exc, function_location(fallback))}") from exc


def _close(env: Any) -> None:
    if (close := getattr(env, "close", None)) is not None:
        _call(f"env {type(env).__name__}.close", close)


def _check_env_and_reward(cfg: ExperimentConfig, row: dict[str, Any], rewards: RewardRunner) -> str:
    """Build, reset and step the env on ``row`` (its reward runs), then ``check_env``; return
    the reply that was used (the reference completion, or a probe when there is none)."""
    label = f"env {cfg.env.name!r}"
    env = _call(f"{label}: constructing it", env_factory(cfg, rewards), fallback=envs.get(cfg.env.name))
    try:
        _call(f"{label}: reset", env.reset, seed=cfg.seed, options=dict(row))
        reference = _call(f"{label}: reference_completion", reference_completion, env, dict(row))
        probes = probe_actions(env, seed=cfg.seed)
        reply = reference if isinstance(reference, str) and reference else probes[0]
        out = _call(f"{label}: step", env.step, reply)
        info = out[4] if isinstance(out, tuple) and len(out) == 5 and isinstance(out[4], dict) else {}
        failed = str(info.get("reward_error") or f"{label}: its reward failed")
        if info.get("reward_status") in ("reward_error", "timeout") and NOT_SERVED_YET not in failed:
            raise PreflightError(failed)  # (a judge the run has not served yet is asked in the run)
        try:
            check_env(env, seed=cfg.seed, options=dict(row), actions=[reply, *probes])
        except EnvCheckError as exc:
            where = function_location(type(env))
            raise PreflightError(f"{label}: {exc}" + (f" ({where})" if where else "")) from exc
        except Exception as exc:  # noqa: BLE001
            raise PreflightError(f"{label}: check_env raised {describe(exc, function_location(type(env)))}") from exc
    finally:
        _close(env)
    return reply


def _check_agent(cfg: ExperimentConfig, row: dict[str, Any], reply: str, rewards: RewardRunner) -> None:
    """Build the agent and play one episode of ``row`` against a scripted model."""
    label = f"agent {cfg.agent.name!r}"
    agent = _call(f"{label}: constructing it", build_agent, cfg, sampling_params(cfg), fallback=agents.get(cfg.agent.name))
    env = env_factory(cfg, rewards)()
    replies = itertools.chain([reply], itertools.cycle(probe_actions(env, seed=cfg.seed)))
    llm = ScriptedLLM(lambda messages: next(replies))
    timeout = cfg.rollout.episode_timeout
    where = function_location(type(agent))
    try:
        traj = asyncio.run(asyncio.wait_for(agent.run(env, llm, dict(row), seed=cfg.seed), timeout))
    except asyncio.TimeoutError:
        raise PreflightError(f"{label}: one episode against a scripted model did not end within "
                             f"rollout.episode_timeout={timeout:g} s ({where})") from None
    except Exception as exc:  # noqa: BLE001
        who = f"env {cfg.env.name!r}" if blame(exc, env, agent) == "env_error" else label
        raise PreflightError(f"{who}: an episode raised {describe(exc, where)}") from exc
    finally:
        _close(env)
    if not isinstance(traj, Trajectory):
        raise PreflightError(f"{label}: run returned {type(traj).__name__}, not a Trajectory ({where})")
    if not traj.ok and not (traj.status == "reward_error" and NOT_SERVED_YET in failure_cause(traj)):
        raise PreflightError(f"one episode against a scripted model failed: {failure_cause(traj)}")
    try:
        traj.validate()
    except ValueError as exc:
        raise PreflightError(f"{label}: run returned an invalid trajectory: {exc} ({where})") from exc


def reference_turns(conversation: Sequence[Any] | None) -> int:
    """The assistant turns of a reference conversation (its replies, as the agent counts turns); 0 for ``None``."""
    return sum(1 for m in conversation or () if isinstance(m, dict) and m.get("role") == "assistant")


def check_reference_turns(cfg: ExperimentConfig, env: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Refuse a warm start on reference games that the run's episodes cannot finish: a
    :class:`ConfigError` naming ``agent.max_turns`` when a ``reference_conversation`` of the first
    :data:`REFERENCE_CHECK_ROWS` rows (a sample, the same whatever the dataset's size) has more
    assistant turns than ``agent.max_turns`` allows. An exception of the env's method propagates."""
    longest = max((reference_turns(reference_conversation(env, dict(row))) for row in rows[:REFERENCE_CHECK_ROWS]),
                  default=0)
    if longest > cfg.agent.max_turns:
        raise ConfigError("agent.max_turns", f"env {cfg.env.name!r}: reference games take up to {longest} assistant "
                          f"turns but agent.max_turns={cfg.agent.max_turns}; set agent.max_turns={longest} (or more)")


def _check_reference_games(cfg: ExperimentConfig, rows: Sequence[dict[str, Any]], rewards: RewardRunner) -> None:
    """:func:`check_reference_turns` on an env of ``cfg`` (an exception of the env's is a PreflightError)."""
    label = f"env {cfg.env.name!r}"
    env = _call(f"{label}: constructing it", env_factory(cfg, rewards), fallback=envs.get(cfg.env.name))
    try:
        check_reference_turns(cfg, env, rows)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise PreflightError(f"{label}: reference_conversation raised {describe(exc, function_location(type(env)))}") from exc
    finally:
        _close(env)


def preflight(cfg: ExperimentConfig) -> None:
    """Check the env, its reward and the agent of ``cfg`` on one training row (see the module doc).

    Raises :class:`PreflightError` (or the dataset's ``DatasetError``, or a ``ConfigError`` of
    :func:`check_reference_turns` when the run warm-starts) with one line; does nothing in
    ``mode=train``, which plays no episodes.
    """
    check_not_in_worker()
    if cfg.mode == "train":
        return
    rows = load_dataset_rows(cfg, "train")
    if not rows:
        raise PreflightError(f"env {cfg.env.name!r}: the training data has no rows")
    with RewardRunner(timeout=cfg.rollout.reward_timeout, max_workers=1) as rewards:
        _check_agent(cfg, rows[0], _check_env_and_reward(cfg, rows[0], rewards), rewards)
        if cfg.actor.path is None:  # the tiny default model is warm-started on the env's reference games
            _check_reference_games(cfg, rows, rewards)
