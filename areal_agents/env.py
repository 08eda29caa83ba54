"""Text environments: a Gymnasium ``Env`` whose observations and actions are text.

Subclass :class:`Env`, implement ``reset`` and ``step``, register the class with
``@register_env("name")`` and validate it with :func:`check_env`. Observations are a
``str`` (shown to the model as a user message) or a list of chat messages; actions are the
model's reply text. The info of the step that ends an episode carries ``"success": bool``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import math
import numbers
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium

__all__ = ["Env", "EnvCheckError", "Observation", "TextSpace", "check_env", "make_env", "run_in_thread"]

Observation = str | list[dict[str, Any]]

DEFAULT_PROBE_ACTIONS = ("42", "", "The answer is \\boxed{7}.", "<python>print(6*7)</python>", "1+2", "50")


def _deliver(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if not fut.done():
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


async def run_in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``await fn(*args, **kwargs)`` run on a new daemon thread (like ``asyncio.to_thread``).

    Unlike ``asyncio.to_thread`` it does not use the event loop's bounded default pool: a
    sync env call that never returns parks one daemon thread of its own, so it can neither
    starve other episodes of pool threads nor hold up the loop's shutdown. A
    ``BaseException`` such as ``SystemExit`` raised by ``fn`` arrives as a ``RuntimeError``,
    so it cannot stop the caller's event loop.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    ctx = contextvars.copy_context()

    def work() -> None:
        try:
            outcome: tuple[bool, Any] = (True, ctx.run(fn, *args, **kwargs))
        except Exception as exc:
            outcome = (False, exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit etc. must not reach the loop
            outcome = (False, RuntimeError(f"{type(exc).__name__} raised in {getattr(fn, '__name__', fn)}: {exc}"))
        try:
            loop.call_soon_threadsafe(_deliver, fut, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits for the result any more
            pass

    threading.Thread(target=work, name=f"env-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await fut


class TextSpace(gymnasium.spaces.Space):
    """Any text (or, for observations, a list of ``{"role", "content"}`` chat messages)."""

    def __init__(self, allow_messages: bool = False) -> None:
        super().__init__(shape=None, dtype=None)
        self.allow_messages = allow_messages

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        return self.allow_messages and _is_messages(x)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return ""

    def __repr__(self) -> str:
        return "TextSpace(messages)" if self.allow_messages else "TextSpace()"


def _is_messages(x: Any) -> bool:
    return isinstance(x, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in x
    )


class Env(gymnasium.Env):
    """Base class of text environments (see the module docstring).

    Class attributes a subclass may set:

    * ``default_dataset`` — registered dataset whose rows this env plays by default;
    * ``default_dataset_kwargs`` — keyword arguments for that dataset.

    ``reset(seed=None, options=row)`` starts an episode for the dataset ``row``; with
    ``options=None`` it draws a row of the default dataset (seeded). ``step(text)`` returns
    ``(observation, reward, terminated, truncated, info)``. :meth:`areset` / :meth:`astep`
    run the sync methods on a thread of their own (:func:`run_in_thread`); override them for
    natively async envs.
    """

    metadata = {"render_modes": []}
    default_dataset: ClassVar[str | None] = None
    default_dataset_kwargs: ClassVar[dict[str, Any]] = {}
    observation_space = TextSpace(allow_messages=True)
    action_space = TextSpace()

    row: dict[str, Any] | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Seed the env's RNG (``self.np_random``); subclasses call ``super().reset(seed=seed)``."""
        super().reset(seed=seed)
        return "", {}

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__}.step is not implemented")

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        return await run_in_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        return await run_in_thread(self.step, action)

    def close(self) -> None:
        """Release resources (sandboxes, files); the default does nothing."""

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        """A correct first reply to ``row`` for supervised warm start, or ``None`` if there is none."""
        return None

    def compute_reward(self, reward: Any, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """Evaluate a reward (registered name or function) in the process-wide
        :class:`~areal_agents.rewards.RewardRunner`; returns ``(value, info)`` where ``info`` has
        ``reward_status`` (``ok`` / ``reward_error`` / ``timeout``) and, on failure, ``reward_error``.
        A failed reward counts as 0.0."""
        from areal_agents.rewards import get_default_runner

        result = get_default_runner().compute(reward, completion, row)
        info: dict[str, Any] = {"reward_status": result.status}
        if not result.ok:
            info["reward_error"] = result.error
        return result.value, info

    def resolve_row(self, options: dict[str, Any] | None, required: tuple[str, ...] = ()) -> dict[str, Any]:
        """A copy of the ``reset`` options row (or :meth:`sample_row`), checked for ``required`` fields."""
        row = dict(options) if options is not None else self.sample_row()
        for key in required:
            if key not in row:
                raise ValueError(f"{type(self).__name__}.reset: the row needs a {key!r} field (got {sorted(row)})")
        return row

    def sample_row(self) -> dict[str, Any]:
        """A row of ``default_dataset`` drawn with ``self.np_random`` (for ``reset(options=None)``)."""
        name = type(self).default_dataset
        if not name:
            raise ValueError(f"{type(self).__name__}.reset needs options=<dataset row> (no default_dataset)")
        cache = type(self).__dict__.get("_sample_rows")
        if cache is None:
            from areal_agents.registry import datasets

            factory = datasets.get(name)
            kwargs = dict(type(self).default_dataset_kwargs)
            if "size" in inspect.signature(factory).parameters:
                kwargs.setdefault("size", 256)
            cache = factory("train", **kwargs)
            type(self)._sample_rows = cache  # type: ignore[attr-defined]
        return dict(cache[int(self.np_random.integers(len(cache)))])


def make_env(name: str, **kwargs: Any) -> Env:
    """Construct the env registered as ``name`` with ``kwargs`` (e.g. ``cfg.env.kwargs``)."""
    from areal_agents.registry import envs

    factory = envs.get(name)
    try:
        env = factory(**kwargs)
    except TypeError as exc:
        raise TypeError(f"env {name!r}: bad constructor arguments {sorted(kwargs)}: {exc}") from None
    if not isinstance(env, Env):
        raise TypeError(f"env {name!r} built a {type(env).__name__}, which is not an areal_agents.Env subclass")
    return env


# -- checker ---------------------------------------------------------------------------------


class EnvCheckError(AssertionError):
    """:func:`check_env` found a problem; the message says what to change."""


def _fail(env: Any, msg: str) -> None:
    raise EnvCheckError(f"check_env({type(env).__name__}): {msg}")


def _check_obs(env: Any, obs: Any, where: str) -> None:
    if not isinstance(obs, str) and not _is_messages(obs):
        _fail(
            env,
            f"{where} returned an observation of type {type(obs).__name__}; return a str or a list of "
            "{'role': str, 'content': str} messages",
        )


def _check_reset(env: Env, out: Any, where: str) -> tuple[Observation, dict[str, Any]]:
    if not isinstance(out, tuple) or len(out) != 2:
        _fail(env, f"{where} must return (observation, info), got {type(out).__name__} {out!r:.80}")
    obs, info = out
    _check_obs(env, obs, where)
    if not isinstance(info, dict):
        _fail(env, f"{where} must return info as a dict, got {type(info).__name__}")
    return obs, info


def _check_step(env: Env, out: Any, where: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
    if not isinstance(out, tuple) or len(out) != 5:
        n = len(out) if isinstance(out, tuple) else type(out).__name__
        _fail(env, f"{where} must return 5 values (observation, reward, terminated, truncated, info); got {n}")
    obs, reward, terminated, truncated, info = out
    _check_obs(env, obs, where)
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        _fail(env, f"{where} returned reward {reward!r} of type {type(reward).__name__}; return a float")
    if not math.isfinite(float(reward)):
        _fail(env, f"{where} returned reward {reward}; rewards must be finite")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            _fail(env, f"{where} returned {name}={flag!r} ({type(flag).__name__}); return a bool")
    if not isinstance(info, dict):
        _fail(env, f"{where} must return info as a dict, got {type(info).__name__}")
    if (terminated or truncated) and not isinstance(info.get("success"), bool):
        _fail(env, f"{where} ended the episode; its info must contain 'success': bool (got {info.get('success')!r})")
    return obs, float(reward), terminated, truncated, info


def _rollout(env: Env, seed: int, actions: Sequence[str], steps: int, options: dict[str, Any] | None) -> list[Any]:
    trace: list[Any] = [_check_reset(env, env.reset(seed=seed, options=options), f"reset(seed={seed})")[0]]
    for i in range(steps):
        action = actions[i % len(actions)]
        obs, reward, terminated, truncated, _ = _check_step(env, env.step(action), f"step({action!r}) #{i}")
        trace.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            break
    return trace


def check_env(env: Any, *, seed: int = 0, steps: int = 8, actions: Sequence[str] | None = None,
              options: dict[str, Any] | None = None) -> None:
    """Validate a text env the way Gymnasium's checker does; raise :class:`EnvCheckError` if not.

    Checks: it is an :class:`Env`; ``reset`` returns ``(obs, info)`` with a ``str``/messages
    observation and a dict info; ``step`` returns 5 values with a finite float reward, bool
    flags and a dict info (``"success": bool`` when the episode ends); the same seed and the
    same actions give the same observations and rewards; ``areset``/``astep`` agree with the
    sync methods; ``reference_completion`` returns ``str`` or ``None``. ``actions`` are
    played in turn (default: a few generic probe replies) for at most ``steps`` steps;
    ``options`` (a dataset row) is passed to every reset (default: the env draws a row).
    """
    if not isinstance(env, Env):
        _fail(env, "the env must subclass areal_agents.Env (observations and actions are text)")
    probes = list(actions) if actions else list(DEFAULT_PROBE_ACTIONS)
    if not all(isinstance(a, str) for a in probes):
        raise TypeError("check_env: actions must be strings")
    first = _rollout(env, seed, probes, steps, options)
    second = _rollout(env, seed, probes, steps, options)
    if first != second:
        diff = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
        what = "reset" if diff == 0 else f"step #{diff - 1}"
        _fail(
            env,
            f"not deterministic: {what} differs between two runs with seed={seed} and the same actions "
            f"({first[diff]!r:.80} vs {second[diff]!r:.80}); draw randomness from self.np_random after "
            "super().reset(seed=seed)",
        )
    if len(first) != len(second):
        _fail(env, f"not deterministic: episode length differs between two runs with seed={seed}")

    async def _async_trace() -> list[Any]:
        obs, _ = _check_reset(env, await env.areset(seed=seed, options=options), "areset")
        trace: list[Any] = [obs]
        for i in range(len(first) - 1):
            action = probes[i % len(probes)]
            o, r, term, trunc, _ = _check_step(env, await env.astep(action), f"astep({action!r}) #{i}")
            trace.append((o, r, term, trunc))
        return trace

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        async_trace = asyncio.run(_async_trace())
    else:  # called from a coroutine: check the async methods on a loop of their own
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            async_trace = pool.submit(asyncio.run, _async_trace()).result()
    if async_trace != first:
        _fail(env, "areset/astep give different results from reset/step for the same seed and actions")
    row = getattr(env, "row", None)
    if isinstance(row, dict):
        ref = env.reference_completion(row)
        if ref is not None and not isinstance(ref, str):
            _fail(env, f"reference_completion returned {type(ref).__name__}; return a str or None")
