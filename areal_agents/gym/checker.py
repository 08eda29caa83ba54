"""The env checker: :func:`check_env` validates a text env the way Gymnasium's checker validates a Gymnasium env."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from areal_agents.env import Env, Observation, TextSpace, is_messages, reference_completion, reference_conversation
from areal_agents.failures import UserError
from areal_agents.runtime.loop_thread import LoopThread

__all__ = ["EnvCheckError", "EnvCheckWarning", "check_env", "probe_actions"]


class EnvCheckError(UserError, AssertionError):
    """:func:`check_env` found a problem; the message says what to change."""


class EnvCheckWarning(UserWarning):
    """:func:`check_env` found an env that works but leaves a convention to a fallback."""


def _fail(env: Any, msg: str) -> None:
    raise EnvCheckError(f"check_env({type(env).__name__}): {msg}")


def _is_bool(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_))


def _check_obs(env: Any, obs: Any, info: Any, where: str) -> None:
    if not isinstance(obs, str) and not is_messages(obs):
        _fail(env, f"{where} returned an observation of type {type(obs).__name__}; return a str or a list of "
              "{'role': str, 'content': str} messages")
    if not isinstance(info, dict):
        _fail(env, f"{where} must return info as a dict, got {type(info).__name__}")
    if not isinstance(info.get("state_key", ""), str):
        _fail(env, f"{where} returned info['state_key'] of type {type(info['state_key']).__name__}; return a str")


def _check_reset(env: Env, out: Any, where: str) -> Observation:
    if not isinstance(out, tuple) or len(out) != 2:
        _fail(env, f"{where} must return (observation, info), got {type(out).__name__} {out!r:.80}")
    _check_obs(env, out[0], out[1], where)
    return out[0]


def _check_step(env: Env, out: Any, where: str, unreported: list[str]) -> tuple[Observation, float, bool, bool]:
    """The checked ``(obs, reward, terminated, truncated)`` of one step; ``where`` is appended
    to ``unreported`` when the step ends the episode without ``info["success"]``."""
    if not isinstance(out, tuple) or len(out) != 5:
        n = len(out) if isinstance(out, tuple) else type(out).__name__
        _fail(env, f"{where} must return 5 values (observation, reward, terminated, truncated, info); got {n}")
    obs, reward, terminated, truncated, info = out
    _check_obs(env, obs, info, where)
    if _is_bool(reward) or not isinstance(reward, numbers.Real):
        _fail(env, f"{where} returned reward {reward!r} of type {type(reward).__name__}; return a float")
    if not math.isfinite(float(reward)):
        _fail(env, f"{where} returned reward {reward}; rewards must be finite")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not _is_bool(flag):
            _fail(env, f"{where} returned {name}={flag!r} ({type(flag).__name__}); return a bool")
    success = info.get("success")
    if success is not None and not _is_bool(success):
        _fail(env, f"{where} returned info['success']={success!r} ({type(success).__name__}); return a bool")
    if (terminated or truncated) and success is None:
        unreported.append(where)
    return obs, float(reward), bool(terminated), bool(truncated)


def _play(env: Env, reset: Callable[..., Any], step: Callable[[str], Any], prefix: str, seed: int,
          options: dict[str, Any] | None, actions: Sequence[str], steps: int, unreported: list[str]) -> list[Any]:
    """One checked episode with ``reset``/``step`` (the env's sync methods or its async ones run
    to completion), reset with ``options``: the observation after reset, then ``(obs, reward,
    terminated, truncated)`` per step, stopping when the episode ends or after ``steps`` steps."""
    trace: list[Any] = [_check_reset(env, reset(seed=seed, options=options), f"{prefix}reset(seed={seed})")]
    for i in range(steps):
        action = actions[i % len(actions)]
        outcome = _check_step(env, step(action), f"{prefix}step({action!r}) #{i}", unreported)
        trace.append(outcome)
        if outcome[2] or outcome[3]:
            break
    return trace


def probe_actions(env: Env, n: int = 4, seed: int = 0) -> list[str]:
    """Replies to try ``env`` with: the probes of its action space (a :class:`~areal_agents.env.TextSpace`,
    in their order), or else ``n`` draws of ``env.action_space.sample()`` after seeding the space with ``seed``."""
    space = env.action_space
    if isinstance(space, TextSpace):
        return list(space.probes)
    space.seed(seed)
    drawn = [space.sample() for _ in range(n)]
    if not all(isinstance(a, str) for a in drawn):
        _fail(env, f"action_space {space!r} samples non-text actions; use areal_agents.env.TextSpace(probes=...)")
    return drawn


def _overrides(env: Env, name: str) -> bool:
    return getattr(type(env), name) is not getattr(Env, name)


def _difference(a: list[Any], b: list[Any]) -> str | None:
    """Where two checked episodes first differ (None if they are equal)."""
    if a == b:
        return None
    diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if diff is None:
        return f"the episode length differs ({len(a) - 1} vs {len(b) - 1} steps)"
    return f"{'reset' if diff == 0 else f'step #{diff - 1}'} differs ({a[diff]!r:.80} vs {b[diff]!r:.80})"


def check_env(env: Any, *, seed: int = 0, steps: int = 8, actions: Sequence[str] | None = None,
              options: dict[str, Any] | None = None) -> None:
    """Validate a text env the way Gymnasium's checker does: raise :class:`EnvCheckError` for a
    contract violation, warn (:class:`EnvCheckWarning`) where a convention is left to a fallback.

    Errors: it is not an :class:`Env`; ``reset`` does not return ``(obs, info)`` with a
    ``str``/messages observation and a dict info; ``step`` does not return 5 values with a
    finite real reward, bool flags (Python or NumPy) and a dict info; ``info["success"]`` is
    present but not a bool; the same seed and actions give different observations or rewards;
    ``areset``/``astep`` disagree with the sync methods; ``reference_completion`` returns
    neither ``str`` nor ``None`` (``reference_conversation``: neither chat messages nor ``None``). An env that implements only ``areset``/``astep`` (natively
    async) is checked through them. Warning: the last step has no ``info["success"]`` (then
    ``success = reward > 0`` in evaluation). ``actions`` are played in turn (default: the env's
    action-space probes, :func:`probe_actions`) for at most ``steps`` steps; ``options`` (a dataset row) is passed
    to every ``reset``/``areset`` (default ``None``: the env draws a seeded row of its
    ``default_dataset``; an env without one needs ``options``). Gymnasium's own
    ``gymnasium.utils.env_checker.check_env`` checks the Gymnasium API besides; the built-ins pass both.
    """
    if not isinstance(env, Env):
        _fail(env, "the env must subclass areal_agents.Env (observations and actions are text)")
    probes = list(actions) if actions else probe_actions(env, seed=seed)
    if not all(isinstance(a, str) for a in probes):
        raise TypeError("check_env: actions must be strings")
    if not _overrides(env, "step") and not _overrides(env, "astep"):
        _fail(env, "implement step(action) (or async astep(action)) returning (obs, reward, terminated, truncated, info)")
    unreported: list[str] = []
    loop = LoopThread("check-env")  # one loop of its own for every async call, even inside a coroutine
    loop.start()
    try:
        areset = lambda **kw: loop.run(env.areset(**kw))  # noqa: E731
        astep = lambda action: loop.run(env.astep(action))  # noqa: E731
        if _overrides(env, "step"):
            first = _play(env, env.reset, env.step, "", seed, options, probes, steps, unreported)
            second = _play(env, env.reset, env.step, "", seed, options, probes, steps, unreported)
            async_trace = _play(env, areset, astep, "a", seed, options, probes, len(first) - 1, unreported)
        else:  # natively async: areset/astep are the env
            first = _play(env, areset, astep, "a", seed, options, probes, steps, unreported)
            second = async_trace = _play(env, areset, astep, "a", seed, options, probes, steps, unreported)
    finally:
        loop.stop()
    if (diff := _difference(first, second)) is not None:
        _fail(env, f"not deterministic: {diff} between two runs with seed={seed} and the same actions; "
              "draw randomness from self.np_random after super().reset(seed=seed)")
    if (diff := _difference(first, async_trace)) is not None:
        _fail(env, f"areset/astep give different results from reset/step for the same seed and actions: {diff}")
    if unreported:
        warnings.warn(
            f"check_env({type(env).__name__}): {unreported[0]} ended the episode without info['success']; "
            "evaluation then counts the episode as solved when its return is > 0 (success = reward > 0). "
            "Put 'success': bool in the info of the last step to decide it yourself.",
            EnvCheckWarning,
            stacklevel=2,
        )
    row = getattr(env, "row", None)
    if isinstance(row, dict):
        ref = reference_completion(env, row)
        if ref is not None and not isinstance(ref, str):
            _fail(env, f"reference_completion returned {type(ref).__name__}; return a str or None")
        conv = reference_conversation(env, row)
        if conv is not None and not (isinstance(conv, list) and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in conv)
                and any(m["role"] == "assistant" for m in conv)):
            _fail(env, "reference_conversation must return None or a list of {'role': ..., ...} chat messages "
                       "with at least one assistant message")
