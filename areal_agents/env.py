"""Text environments: a Gymnasium ``Env`` whose observations and actions are text.

Subclass :class:`Env`, implement ``reset`` and ``step``, register the class with
``@register_env("name")`` and validate it with :func:`check_env`. Observations are a
``str`` (shown to the model as a user message) or a list of chat messages; actions are the
model's reply text. The info of the step that ends an episode should carry ``"success": bool``;
without it, evaluation counts an episode as solved when its return is positive.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import math
import numbers
import queue
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium
import numpy as np

from areal_agents.data import default_rows
from areal_agents.loop_thread import LoopThread

__all__ = ["Env", "EnvCheckError", "EnvCheckWarning", "Observation", "TextSpace", "TurnLimitedEnv", "check_env", "make_env",
           "run_in_thread"]

Observation = str | list[dict[str, Any]]

DEFAULT_PROBE_ACTIONS = ("42", "", "The answer is \\boxed{7}.", "<python>print(6*7)</python>", "1+2", "50")


def _deliver(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if not fut.done():
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


class _ElasticThreads:
    """Daemon worker threads that are reused, and added whenever none is idle (see :func:`run_in_thread`).

    Reuse saves a thread start per env call (under GIL pressure, starting a thread stalls the
    event loop that asked for it). Idle threads are reused in turn, the longest idle first, so
    that under steady load none sits idle long enough to leave, and the next burst of env calls
    finds the threads the last one started; a thread idle for ``idle_s`` seconds leaves.
    """

    def __init__(self, idle_s: float = 1.0) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: collections.deque[queue.SimpleQueue[Callable[[], None]]] = collections.deque()  # their inboxes

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.popleft() if self._idle else None
        if inbox is None:
            threading.Thread(target=self._work, args=(job,), name="env-call", daemon=True).start()
        else:
            inbox.put(job)

    def _work(self, job: Callable[[], None]) -> None:
        inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        while True:
            job()
            with self._lock:
                self._idle.append(inbox)
            try:
                job = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # nobody took this thread: leave
                        self._idle.remove(inbox)
                        return
                job = inbox.get()  # taken just as the wait ended: its job is on the way


_THREADS = _ElasticThreads()


async def run_in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``await fn(*args, **kwargs)`` run on a worker thread (like ``asyncio.to_thread``).

    Unlike ``asyncio.to_thread`` it does not use the event loop's bounded default pool: a
    sync env call that never returns parks one daemon thread of its own, so it can neither
    starve other episodes of threads nor hold up the loop's shutdown (threads are reused
    while they are free, and added when none is). A ``BaseException`` such as
    ``SystemExit`` raised by ``fn`` arrives as a ``RuntimeError``, so it cannot stop the
    caller's event loop.
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
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for the result any more
            loop.call_soon_threadsafe(_deliver, fut, *outcome)

    _THREADS.submit(work)
    return await fut


class TextSpace(gymnasium.spaces.Space):
    """Any text (or, for observations, a list of ``{"role", "content"}`` chat messages)."""

    def __init__(self, allow_messages: bool = False) -> None:
        super().__init__(shape=None, dtype=None)
        self.allow_messages = allow_messages

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) or (self.allow_messages and _is_messages(x))

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
    * ``default_dataset_kwargs`` — keyword arguments for that dataset (an env whose constructor
      arguments decide them, e.g. a task name, overrides :meth:`dataset_kwargs_for` and sets
      ``self.dataset_kwargs`` in ``__init__``);
    * ``default_config`` — config keys a run of this env uses unless the YAML or an override
      sets them (nested dicts, e.g. ``{"agent": {"name": "my-agent"}}``);
    * ``tools`` — OpenAI function specs the model is shown (:class:`~areal_agents.agent.ChatAgent`
      renders them with the chat template; an instance may set its own in ``reset``).

    ``reset(seed=None, options=row)`` starts an episode for the dataset ``row``; with no row
    (``options`` None or ``{}``) it draws one of ``default_dataset`` with ``self.np_random``
    (:meth:`resolve_row`), as Gymnasium's own checker expects. ``step(text)`` returns
    ``(observation, reward, terminated, truncated, info)``. :meth:`areset` / :meth:`astep`
    run the sync methods on a thread of their own (:func:`run_in_thread`); override them for
    natively async envs.

    State keys (for GiGPO's step groups): the info of ``reset`` or ``step`` may carry
    ``"state_key": str``, a name of the state the next turn acts in; turns of one group with
    equal keys are compared with each other. Without it the agent hashes the observation.
    """

    default_dataset: ClassVar[str | None] = None
    default_dataset_kwargs: ClassVar[dict[str, Any]] = {}
    dataset_kwargs: dict[str, Any] | None = None  # this instance's, when its constructor arguments decide them
    default_config: ClassVar[dict[str, Any]] = {}
    tools: list[dict[str, Any]] | None = None
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

    def reference_conversation(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A correct whole episode of ``row`` as OpenAI chat messages for the warm start (e.g. user,
        assistant with ``tool_calls``, ``tool`` result, assistant answer), rendered with ``tools``;
        only the assistant turns are trained. ``None`` (the default): :meth:`reference_completion`."""
        return None

    def compute_reward(self, reward: Any, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """Evaluate a reward (registered name or function) in the process-wide
        :class:`~areal_agents.rewards.RewardRunner`; returns ``(value, info)`` where ``info`` has
        ``reward_status`` (``ok`` / ``reward_error`` / ``timeout``) and, on failure, ``reward_error``.
        A failed reward counts as 0.0."""
        from areal_agents.rewards import get_default_runner

        return _reward_outcome(get_default_runner().compute(reward, completion, row))

    async def acompute_reward(self, reward: Any, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """:meth:`compute_reward` for natively async envs (``astep`` / ``aplay_turn``): the
        worker's reply is awaited in the event loop, not on a thread."""
        from areal_agents.rewards import get_default_runner

        return _reward_outcome(await get_default_runner().acompute(reward, completion, row))

    def resolve_row(self, options: dict[str, Any] | None, required: tuple[str, ...] = ()) -> dict[str, Any]:
        """A copy of the ``reset`` options row, checked for ``required`` fields; with no row
        (``options`` None, or empty while the env has a ``default_dataset``: Gymnasium's checker
        resets with ``options={}``) a row drawn by :meth:`sample_row`."""
        if options is None or (not options and type(self).default_dataset):
            row = self.sample_row()
        else:
            row = dict(options)
        for key in required:
            if key not in row:
                raise ValueError(f"{type(self).__name__}.reset: the row needs a {key!r} field (got {sorted(row)})")
        return row

    @classmethod
    def dataset_kwargs_for(cls, env_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of ``default_dataset`` for an env built with ``env_kwargs``
        (``cfg.env.kwargs``): ``default_dataset_kwargs`` unless a subclass derives them from its
        constructor arguments (``env.kwargs.task=chain_sum`` picks the rows of that task)."""
        return dict(cls.default_dataset_kwargs)

    def sample_row(self) -> dict[str, Any]:
        """A copy of a row of ``default_dataset`` (its ``train`` split, with ``self.dataset_kwargs`` or else
        ``default_dataset_kwargs``; at most 256 rows unless they set ``size``) drawn with ``self.np_random``, so ``reset(seed=s)``
        draws the same row for the same ``s``. The rows are loaded once per dataset and kwargs."""
        cls = type(self)
        if not cls.default_dataset:
            raise ValueError(f"{cls.__name__}.reset() needs options=<dataset row>: the env has no default_dataset "
                             "to draw one from (set default_dataset to a registered dataset name)")
        kwargs = cls.default_dataset_kwargs if self.dataset_kwargs is None else self.dataset_kwargs
        rows = default_rows(cls.default_dataset, kwargs)
        return dict(rows[int(self.np_random.integers(len(rows)))])


def _reward_outcome(result: Any) -> tuple[float, dict[str, Any]]:
    info: dict[str, Any] = {"reward_status": result.status}
    if not result.ok:
        info["reward_error"] = result.error
    return result.value, info


class TurnLimitedEnv(Env):
    """An env of up to ``max_turns`` replies to one dataset row.

    A subclass names the row fields it needs in ``required_fields``, may set up an episode in
    :meth:`start` (which returns the first observation, ``row["prompt"]`` by default) and plays
    one reply in :meth:`play_turn`. ``step`` counts turns, adds ``turns`` and ``success``
    (False unless the turn says otherwise) to the info, and truncates after ``max_turns``.
    """

    required_fields: ClassVar[tuple[str, ...]] = ("prompt",)

    def __init__(self, max_turns: int) -> None:
        if max_turns < 1:
            raise ValueError(f"{type(self).__name__}: max_turns must be >= 1 (got {max_turns})")
        self.max_turns = max_turns
        self.turn = 0
        self.done = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        self.row = self.resolve_row(options, self.required_fields)
        self.turn, self.done = 0, False
        return self.start(self.row), {}

    def start(self, row: dict[str, Any]) -> Observation:
        """Set up an episode for ``row``; return its first observation."""
        return str(row["prompt"])

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[Observation, float, bool, dict[str, Any]]:
        """``(observation, reward, terminated, info)`` of one reply (``self.turn`` already counts it)."""
        raise NotImplementedError(f"{type(self).__name__}.play_turn is not implemented")

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        row = self._next_turn()
        return self._end_turn(*self.play_turn(action, row))

    async def aplay_turn(self, action: str, row: dict[str, Any]) -> tuple[Observation, float, bool, dict[str, Any]]:
        """:meth:`play_turn` for the event loop: on a worker thread, unless a subclass whose
        turn waits only on asyncio (e.g. :meth:`acompute_reward`) overrides this."""
        return await run_in_thread(self.play_turn, action, row)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        if type(self).reset is TurnLimitedEnv.reset and type(self).start is TurnLimitedEnv.start:
            return self.reset(seed=seed, options=options)  # a row check and its prompt: nothing to wait for
        return await super().areset(seed=seed, options=options)

    async def astep(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if type(self).step is not TurnLimitedEnv.step:  # a subclass's own step runs as it was written
            return await super().astep(action)
        row = self._next_turn()
        return self._end_turn(*await self.aplay_turn(action, row))

    def _next_turn(self) -> dict[str, Any]:
        if self.row is None or self.done:
            raise RuntimeError(f"{type(self).__name__}.step called before reset() or after the episode ended")
        self.turn += 1
        return self.row

    def _end_turn(self, obs: Observation, reward: float, terminated: bool,
                  turn_info: dict[str, Any]) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        info: dict[str, Any] = {"turns": self.turn, "success": False, **turn_info}
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, info


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


class EnvCheckWarning(UserWarning):
    """:func:`check_env` found an env that works but leaves a convention to a fallback."""


def _fail(env: Any, msg: str) -> None:
    raise EnvCheckError(f"check_env({type(env).__name__}): {msg}")


def _is_bool(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_))


def _check_obs(env: Any, obs: Any, info: Any, where: str) -> None:
    if not isinstance(obs, str) and not _is_messages(obs):
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
    ``success = reward > 0`` in evaluation). ``actions`` are played in turn (default: a few
    generic probe replies) for at most ``steps`` steps; ``options`` (a dataset row) is passed
    to every ``reset``/``areset`` (default ``None``: the env draws a seeded row of its
    ``default_dataset``; an env without one needs ``options``). Gymnasium's own
    ``gymnasium.utils.env_checker.check_env`` checks the Gymnasium API besides; the built-ins pass both.
    """
    if not isinstance(env, Env):
        _fail(env, "the env must subclass areal_agents.Env (observations and actions are text)")
    probes = list(actions) if actions else list(DEFAULT_PROBE_ACTIONS)
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
        ref = env.reference_completion(row)
        if ref is not None and not isinstance(ref, str):
            _fail(env, f"reference_completion returned {type(ref).__name__}; return a str or None")
        conv = env.reference_conversation(row)
        if conv is not None and not (isinstance(conv, list) and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in conv)
                and any(m["role"] == "assistant" for m in conv)):
            _fail(env, "reference_conversation must return None or a list of {'role': ..., ...} chat messages "
                       "with at least one assistant message")
