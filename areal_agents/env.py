"""Text environments: a Gymnasium ``Env`` whose observations and actions are text.

Subclass :class:`Env`, implement ``reset`` and ``step``, register the class with
``@register_env("name")`` and validate it with :func:`~areal_agents.gym.checker.check_env`. Observations are a
``str`` (shown to the model as a user message) or a list of chat messages; actions are the
model's reply text. The info of the step that ends an episode should carry ``"success": bool``;
without it, evaluation counts an episode as solved when its return is positive.

:class:`Env` is the Gymnasium contract alone (reset, step, spaces, ``np_random``, and their async
variants). What a run needs besides comes from small mixins an env lists before ``Env`` when it
uses them: :class:`DatasetMixin` (rows of a registered dataset; ``reset()`` without a row draws
one), :class:`RewardMixin` (``compute_reward`` in the run's reward workers) and
:class:`ReferenceMixin` (correct replies for the supervised warm start). Optional class
attributes the framework reads: ``tools`` (OpenAI function specs the model is shown) and
``default_config`` (``env.*``, ``agent.*`` and ``sampling.*`` keys a run of this env uses unless
the user's config sets them; run-level keys belong in a recipe, see ``docs/custom_env.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium
import numpy as np

from areal_agents.data import default_rows
from areal_agents.runtime.threads import run_in_thread

if TYPE_CHECKING:
    from areal_agents.rewards import RewardRunner

__all__ = ["GENERIC_PROBES", "DatasetMixin", "Env", "Observation", "ReferenceMixin", "RewardMixin", "TextSpace", "TurnLimitedEnv",
           "is_messages", "reference_completion", "reference_conversation"]

Observation = str | list[dict[str, Any]]

GENERIC_PROBES = ("42", "", "I do not know.")  # a TextSpace's probes when it is given none


class TextSpace(gymnasium.spaces.Space[str]):
    """Any text (or, for observations, a list of ``{"role", "content"}`` chat messages).

    ``probes`` are replies worth trying on the env (its answer format, a wrong answer, an empty
    reply); :meth:`sample` draws one with the space's RNG and :func:`~areal_agents.gym.checker.check_env`
    plays them in turn. An env gives its action space its own probes
    (``action_space = TextSpace(probes=("<python>print(6*7)</python>", "42"))``); without them a
    few generic replies stand in.
    """

    def __init__(self, allow_messages: bool = False, probes: Sequence[str] = (),
                 seed: int | np.random.Generator | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        if isinstance(probes, str) or not all(isinstance(p, str) for p in probes):
            raise TypeError(f"TextSpace: probes must be a sequence of strings (got {probes!r:.80})")
        self.allow_messages = allow_messages
        self.probes: tuple[str, ...] = tuple(probes) or GENERIC_PROBES

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) or (self.allow_messages and is_messages(x))

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """One of :attr:`probes`, drawn with ``self.np_random`` (``space.seed(s)`` repeats the draws)."""
        return self.probes[int(self.np_random.integers(len(self.probes)))]

    def __repr__(self) -> str:
        args = ["messages"] if self.allow_messages else []
        if self.probes != GENERIC_PROBES:
            args.append(f"probes={self.probes!r}")
        return f"TextSpace({', '.join(args)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextSpace) and (self.allow_messages, self.probes) == (other.allow_messages, other.probes)

    def __hash__(self) -> int:
        return hash((self.allow_messages, self.probes))


def is_messages(x: Any) -> bool:
    return isinstance(x, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in x
    )


class Env(gymnasium.Env[Observation, str]):
    """Base class of text environments: Gymnasium's contract, with text for observations and actions.

    ``reset(seed=None, options=row)`` starts an episode (``options`` is the dataset row the run
    plays, or None) and returns ``(observation, info)``; ``step(text)`` returns
    ``(observation, reward, terminated, truncated, info)``. Randomness comes from
    ``self.np_random``, seeded by ``super().reset(seed=seed)``. :meth:`areset` / :meth:`astep`
    run the sync methods on a thread of their own (:func:`run_in_thread`); override them for
    natively async envs. Datasets, rewards and warm-start references are mixins
    (:class:`DatasetMixin`, :class:`RewardMixin`, :class:`ReferenceMixin`).

    State keys (for GiGPO's step groups): the info of ``reset`` or ``step`` may carry
    ``"state_key": str``, a name of the state the next turn acts in; turns of one group with
    equal keys are compared with each other. Without it the agent hashes the observation.
    """

    observation_space = TextSpace(allow_messages=True)
    action_space = TextSpace()

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


class DatasetMixin:
    """Rows of a registered dataset for an :class:`Env` (list it before ``Env``:
    ``class MyEnv(DatasetMixin, Env)``).

    * ``default_dataset`` — the registered dataset whose rows the env plays by default (a run
      takes its train and test rows from it unless ``data.name`` says otherwise);
    * ``default_dataset_kwargs`` — keyword arguments for that dataset (an env whose constructor
      arguments decide them, e.g. a task name, overrides :meth:`dataset_kwargs_for` and sets
      ``self.dataset_kwargs`` in ``__init__``).

    ``self.row = self.resolve_row(options)`` in ``reset`` takes the row the run passes, or with
    none (``options`` None, or ``{}`` as Gymnasium's own checker resets) draws one of
    ``default_dataset`` with ``self.np_random``.
    """

    default_dataset: ClassVar[str | None] = None
    default_dataset_kwargs: ClassVar[dict[str, Any]] = {}
    dataset_kwargs: dict[str, Any] | None = None  # this instance's, when its constructor arguments decide them
    row: dict[str, Any] | None = None  # the episode's row, once reset has resolved it
    np_random: np.random.Generator  # the Env's

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


class RewardMixin:
    """Rewards evaluated in the run's reward workers, for an :class:`Env` whose ``step`` scores a
    reply with a registered reward (``class MyEnv(RewardMixin, Env)``).

    Whoever builds the env for a run hands it a :class:`~areal_agents.rewards.RewardRunner` as
    ``reward_runner`` (:func:`~areal_agents.gym.registration.make_env` ``(..., reward_runner=...)``;
    the rollout, evaluation and the preflight check do); an env built by hand, outside a run,
    uses :func:`~areal_agents.rewards.get_default_runner`.
    """

    reward_runner: RewardRunner | None = None
    reward_seconds: float = 0.0
    """Seconds this env's reward calls took in their workers (the rollout reports them: ``time/reward_s``)."""
    judge_calls: int = 0
    """How many of them asked a judge (``perf/judge_calls_per_s``)."""

    def compute_reward(self, reward: Any, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """Evaluate a reward (registered name or function) in this env's runner; returns
        ``(value, info)`` where ``info`` has ``reward_status`` (``ok`` / ``reward_error`` /
        ``timeout``) and, on failure, ``reward_error``. A failed reward counts as 0.0."""
        return self._outcome(self._reward_runner().compute(reward, completion, row))

    async def acompute_reward(self, reward: Any, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """:meth:`compute_reward` for natively async envs (``astep`` / ``aplay_turn``): the
        worker's reply is awaited in the event loop, not on a thread."""
        return self._outcome(await self._reward_runner().acompute(reward, completion, row))

    def _outcome(self, result: Any) -> tuple[float, dict[str, Any]]:
        """``(value, info)`` of a reward call, its cost tallied (never in ``info``: a step's info
        stays the same for the same action, as Gymnasium's checker requires)."""
        self.reward_seconds += result.seconds
        self.judge_calls += result.judge_calls
        return _reward_outcome(result)

    def _reward_runner(self) -> RewardRunner:
        if self.reward_runner is not None:
            return self.reward_runner
        from areal_agents.rewards import get_default_runner

        return get_default_runner()


def _reward_outcome(result: Any) -> tuple[float, dict[str, Any]]:
    info: dict[str, Any] = {"reward_status": result.status}
    if not result.ok:
        info["reward_error"] = result.error
    return result.value, info


class ReferenceMixin:
    """Correct replies for the supervised warm start of the tiny default model
    (``class MyEnv(ReferenceMixin, Env)``); override one or both methods.

    The framework reads them through :func:`reference_completion` / :func:`reference_conversation`,
    which also take an env that defines the methods without this mixin, and give ``None`` for an
    env with neither.
    """

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        """A correct first reply to ``row`` for supervised warm start, or ``None`` if there is none."""
        return None

    def reference_conversation(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A correct whole episode of ``row`` as OpenAI chat messages for the warm start (e.g. user,
        assistant with ``tool_calls``, ``tool`` result, assistant answer), rendered with ``tools``;
        only the assistant turns are trained. ``None`` (the default): :meth:`reference_completion`."""
        return None


def reference_completion(env: Any, row: dict[str, Any]) -> str | None:
    """``env.reference_completion(row)``, or ``None`` for an env without one."""
    method = getattr(env, "reference_completion", None)
    return None if method is None else method(row)  # type: ignore[no-any-return]


def reference_conversation(env: Any, row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """``env.reference_conversation(row)``, or ``None`` for an env without one."""
    method = getattr(env, "reference_conversation", None)
    return None if method is None else method(row)  # type: ignore[no-any-return]


class TurnLimitedEnv(DatasetMixin, Env):
    """An env of up to ``max_turns`` replies to one dataset row (its rows come from
    :class:`DatasetMixin`: ``reset`` resolves ``options`` into ``self.row``).

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
