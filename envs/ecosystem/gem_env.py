"""``gem``: a GEM env by id, one step per reply (``pip install 'areal-agents[gem]'``)."""

from __future__ import annotations

import logging
import threading
from types import ModuleType
from typing import Any, ClassVar

from envs.ecosystem._games import SeededGameEnv, import_library

__all__ = ["GemEnv"]


def _import_gem() -> ModuleType:
    """``import gem`` without the ``logging.basicConfig`` its package runs on import: the root
    logger keeps its handlers and level."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return import_library("gem", "gem-llm", "gem")
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


class GemEnv(SeededGameEnv):
    """The GEM env ``env_id`` (an id of ``gem.make``, e.g. ``game:Sudoku-v0-easy``,
    ``rg:chain_sum``), made with ``env_kwargs``.

    Observations, rewards and the end of an episode are GEM's (a GEM episode ends when it
    terminates or truncates); while an episode goes on, the ``info["suffix"]`` GEM returns (what
    to reply next, e.g. ``Enter your next guess.``) is appended to the observation unless
    ``suffix=False``. ``success`` is a last reward of at least ``success_reward``.
    """

    library_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, env_id: str = "game:GuessTheNumber-v0-easy", env_kwargs: dict[str, Any] | None = None,
                 max_turns: int = 16, success_reward: float = 1.0, suffix: bool = True) -> None:
        super().__init__(max_turns, success_reward)
        gem = self._isolated(_import_gem)
        try:
            self.gem_env = self._isolated(lambda: gem.make(env_id, **(env_kwargs or {})))  # some reset on creation
        except ValueError as exc:  # an unknown id
            raise ValueError(f"gem: {exc}") from None
        self.env_id = env_id
        self.suffix = suffix

    def start_game(self, seed: int) -> str:
        obs, _ = self.gem_env.reset(seed=seed)
        return self._text(obs, "reset")

    def play_move(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.gem_env.step(action)
        ended = bool(terminated or truncated)
        text = self._text(obs, "step")
        hint = info.get("suffix") if isinstance(info, dict) else None
        if self.suffix and not ended and isinstance(hint, str) and hint:
            text = f"{text}\n{hint}" if text else hint
        return text, float(reward), ended, {}

    def _text(self, obs: object, where: str) -> str:
        if not isinstance(obs, str):
            raise TypeError(f"gem env {self.env_id!r}: {where} returned a {type(obs).__name__} observation; "
                            "only text observations can be played")
        return obs
