"""``math-multiturn``: retry a math question after a wrong answer, with feedback (AReaL's multi-turn math)."""

from __future__ import annotations

from typing import Any

from areal_agents.env import TurnLimitedEnv
from envs.math import MathEnv

__all__ = ["MultiTurnMathEnv"]


class MultiTurnMathEnv(MathEnv):
    """Like ``math``, but a wrong answer gets ``feedback`` and another try, up to ``max_turns``.

    Reward 1.0 on the turn that is right (0 before), so with ``turn_discount`` γ the episode
    return is γ^k for a success at retry k. Running out of turns truncates the episode.
    """

    def __init__(self, reward: str = "math", max_turns: int = 3, feedback: str = "Wrong, try again.") -> None:
        TurnLimitedEnv.__init__(self, max_turns)
        self.reward, self.feedback = reward, feedback

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        _, reward, _, info = super().play_turn(action, row)
        last = info["success"] or self.turn >= self.max_turns
        return ("" if last else self.feedback), reward, info["success"], info
