"""``textarena``: a single-player TextArena game, one move per reply (``pip install 'areal-agents[textarena]'``)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from envs.ecosystem._games import SeededGameEnv, import_library

__all__ = ["TextArenaEnv"]


class TextArenaEnv(SeededGameEnv):
    """The TextArena game ``game`` (an id of ``textarena.make``, e.g. ``Wordle-v0``, ``Sudoku-v0``),
    made with ``game_kwargs`` and its default wrappers (which, for example, put a bare move in
    ``[brackets]``), played by one player.

    The first observation is the game's prompt; each later one is what the game said since the
    last reply (the reply itself is not repeated). The game's reward comes at its end (a win is
    ``1``; many games give partial credit or ``-1`` for an invalid move); ``success`` is a last
    reward of at least ``success_reward``; ``info["reason"]`` is the game's closing remark.
    """

    library_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, game: str = "GuessTheNumber-v0", game_kwargs: dict[str, Any] | None = None,
                 max_turns: int = 16, success_reward: float = 1.0) -> None:
        super().__init__(max_turns, success_reward)
        ta = self._isolated(lambda: import_library("textarena", "textarena", "textarena"))  # it draws on import
        try:
            self.game = self._isolated(lambda: ta.make(game, **(game_kwargs or {})))
        except ValueError as exc:  # an unknown id
            raise ValueError(f"textarena: {exc}") from None
        self.game_id = game
        base = self.game
        while isinstance(base, ta.Wrapper):  # the wrappers' history and board views are not needed:
            base = base.env  # each observation is the game's messages since the last reply
        self._base = base
        self._action_type = ta.ObservationType.PLAYER_ACTION

    def start_game(self, seed: int) -> str:
        try:
            self.game.reset(num_players=1, seed=seed)
        except AssertionError as exc:  # SinglePlayerState refuses other player counts
            raise ValueError(f"textarena game {self.game_id!r} cannot be played by one player ({exc})") from None
        return self._observe()

    def play_move(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        done, _ = self.game.step(action)
        obs = self._observe()
        if not done:
            return obs, 0.0, False, {}
        state = self._base.state
        rewards = state.rewards or {}
        reason = (state.game_info.get(0) or {}).get("reason")
        return obs, float(rewards.get(0, 0.0)), True, {"reason": str(reason)} if reason is not None else {}

    def _observe(self) -> str:
        """The game's messages to player 0 since the last call, without the player's own move."""
        _, messages = self._base.get_observation()
        return "\n".join(str(text).strip() for sender, text, kind in messages
                         if not (sender == 0 and kind == self._action_type)).strip()
