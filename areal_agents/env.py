"""Text environments: a Gymnasium ``Env`` whose observations and actions are text.

Subclass :class:`Env`, implement ``reset`` and ``step``, register the class with
``@register_env("name")`` and validate it with :func:`~areal_agents.gym.checker.check_env`. Observations are a
``str`` (shown to the model as a user message) or a list of chat messages; actions are the
model's reply text. The info of the step that ends an episode should carry ``"success": bool``;
without it, evaluation counts an episode as solved when its return is positive.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium

from areal_agents.data import default_rows
from areal_agents.runtime.threads import run_in_thread

if TYPE_CHECKING:
    from areal_agents.rewards import RewardRunner

__all__ = ["Env", "Observation", "TextSpace", "TurnLimitedEnv", "is_messages", "run_in_thread"]

Observation = str | list[dict[str, Any]]

# Kept importable from here; they live in areal_agents.gym (the checker imports this module).
_ELSEWHERE = {**dict.fromkeys(("DEFAULT_PROBE_ACTIONS", "EnvCheckError", "EnvCheckWarning", "check_env"),
                              "areal_agents.gym.checker"),
              "make_env": "areal_agents.gym.registration"}


def __getattr__(name: str) -> Any:
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module 'areal_agents.env' has no attribute {name!r}")


class TextSpace(gymnasium.spaces.Space):
    """Any text (or, for observations, a list of ``{"role", "content"}`` chat messages)."""

    def __init__(self, allow_messages: bool = False) -> None:
        super().__init__(shape=None, dtype=None)
        self.allow_messages = allow_messages

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) or (self.allow_messages and is_messages(x))

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return ""

    def __repr__(self) -> str:
        return "TextSpace(messages)" if self.allow_messages else "TextSpace()"


def is_messages(x: Any) -> bool:
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
    reward_runner: RewardRunner | None = None  # handed over by whoever builds the env for a run

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
        """Evaluate a reward (registered name or function) in this env's
        :class:`~areal_agents.rewards.RewardRunner`; returns ``(value, info)`` where ``info`` has
        ``reward_status`` (``ok`` / ``reward_error`` / ``timeout``) and, on failure, ``reward_error``.
        A failed reward counts as 0.0.

        The runner is ``self.reward_runner``, which whoever builds the env for a run hands over
        (:func:`~areal_agents.gym.registration.make_env` ``(..., reward_runner=...)``; the rollout,
        evaluation and the preflight check do); an env built by hand, outside a run, uses
        :func:`~areal_agents.rewards.get_default_runner`."""
        return _reward_outcome(self._reward_runner().compute(reward, completion, row))

    async def acompute_reward(self, reward: Any, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """:meth:`compute_reward` for natively async envs (``astep`` / ``aplay_turn``): the
        worker's reply is awaited in the event loop, not on a thread."""
        return _reward_outcome(await self._reward_runner().acompute(reward, completion, row))

    def _reward_runner(self) -> RewardRunner:
        if self.reward_runner is not None:
            return self.reward_runner
        from areal_agents.rewards import get_default_runner

        return get_default_runner()

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
