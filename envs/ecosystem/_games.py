"""What the TextArena and GEM adapters share: the library imported on first use, episodes
keyed by a seed row, and each episode's own random state.

Both libraries draw their games from the process-wide ``random`` (and GEM from ``numpy.random``)
after seeding it in ``reset``. Episodes run on worker threads side by side, so every call into a
library holds that library's lock and runs with the episode's own saved random state, which is
put back afterwards: the same seed and replies always play the same game, and the rest of the
process keeps its random state.
"""

from __future__ import annotations

import importlib
import random
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import numpy as np

from areal_agents.env import Observation, TurnLimitedEnv

__all__ = ["SeededGameEnv", "game_seeds_dataset", "import_library"]

T = TypeVar("T")
_SEED_SPAN = 1_000_000_000  # train seeds lie in [0, span), test seeds in [span, 2 * span)


def import_library(module: str, package: str, extra: str) -> ModuleType:
    """``import module``, or an ImportError that says which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"this env needs the {package!r} package: pip install 'areal-agents[{extra}]' "
                          f"(import {module} failed: {exc})") from None


def game_seeds_dataset(split: str = "train", *, size: int = 500, seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{"prompt", "answer", "seed"}``, one game each: ``seed`` is the seed the library
    resets its game with. Train and test seeds come from disjoint ranges; ``seed`` picks them."""
    if split not in ("train", "test"):
        raise ValueError(f"game_seeds_dataset: split must be train or test (got {split!r})")
    if size < 0:
        raise ValueError(f"game_seeds_dataset: size must be >= 0 (got {size})")
    rng = random.Random(f"game-seeds:{split}:{seed}")
    base = 0 if split == "train" else _SEED_SPAN
    seeds = [base + rng.randrange(_SEED_SPAN) for _ in range(size)]
    return [{"prompt": f"game seed {s}", "answer": "", "seed": s} for s in seeds]


_RandomState = tuple[Any, Any]  # (random.getstate(), numpy.random.get_state())


class SeededGameEnv(TurnLimitedEnv):
    """A multi-turn game of a library: the row's ``seed`` sets up the game (:meth:`start_game`),
    each reply is one move (:meth:`play_move`). Episodes that end with a last reward of at least
    ``success_reward`` succeed; ``max_turns`` replies truncate an episode the game has not ended."""

    default_dataset = "game-seeds"
    required_fields = ("seed",)
    default_config: ClassVar[dict[str, Any]] = {"agent": {"max_turns": 16}}  # as many replies as the env allows
    library_lock: ClassVar[threading.Lock] = threading.Lock()  # a subclass sets one per library

    def __init__(self, max_turns: int, success_reward: float) -> None:
        super().__init__(max_turns)
        self.success_reward = float(success_reward)
        self._random_state: _RandomState | None = None

    def start(self, row: dict[str, Any]) -> Observation:
        seed = int(row["seed"])
        self._random_state = None
        return self._isolated(lambda: self._seeded_start(seed))

    def _seeded_start(self, seed: int) -> Observation:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        return self.start_game(seed)

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[Observation, float, bool, dict[str, Any]]:
        obs, reward, ended, info = self._isolated(lambda: self.play_move(action))
        reward = float(reward)
        return obs, reward, ended, {**info, "success": bool(ended and reward >= self.success_reward)}

    def _isolated(self, call: Callable[[], T]) -> T:
        """``call()`` (any call into the library, its constructors too) under the library's lock
        with this episode's random state; the process's random state is the same afterwards."""
        with type(self).library_lock:
            outer: _RandomState = (random.getstate(), np.random.get_state())
            try:
                if self._random_state is not None:
                    random.setstate(self._random_state[0])
                    np.random.set_state(self._random_state[1])
                result = call()
                self._random_state = (random.getstate(), np.random.get_state())
                return result
            finally:
                random.setstate(outer[0])
                np.random.set_state(outer[1])

    def start_game(self, seed: int) -> Observation:
        """Reset the library's game with ``seed``; return the first observation."""
        raise NotImplementedError(f"{type(self).__name__}.start_game is not implemented")

    def play_move(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        """``(observation, reward, game_ended, info)`` of one reply."""
        raise NotImplementedError(f"{type(self).__name__}.play_move is not implemented")
