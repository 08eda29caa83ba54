"""``math-multiturn``: retry a math question after a wrong answer, with feedback (AReaL's multi-turn math)."""

from __future__ import annotations

from typing import Any

from envs.math import MathEnv

__all__ = ["MultiTurnMathEnv"]


class MultiTurnMathEnv(MathEnv):
    """Like ``math``, but a wrong answer gets ``feedback`` and another try, up to ``max_turns``.

    Reward 1.0 on the turn that is right (0 before), so with ``turn_discount`` γ the episode
    return is γ^k for a success at retry k. Running out of turns truncates the episode.
    """

    def __init__(self, reward: str = "math", max_turns: int = 3, feedback: str = "Wrong, try again.") -> None:
        super().__init__(reward=reward)
        if max_turns < 1:
            raise ValueError(f"MultiTurnMathEnv: max_turns must be >= 1 (got {max_turns})")
        self.max_turns = max_turns
        self.feedback = feedback

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reward, info = self._score(action)
        info["turns"] = self.turn
        if info["success"]:
            self.done = True
            return "", reward, True, False, info
        if self.turn >= self.max_turns:
            self.done = True
            return "", reward, False, True, info
        return self.feedback, reward, False, False, info
