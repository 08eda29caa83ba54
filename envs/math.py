"""``math``: answer one arithmetic (or GSM8K-style) question; reward from the math reward."""

from __future__ import annotations

from typing import Any, ClassVar

from areal_agents.env import Observation, ReferenceMixin, RewardMixin, TextSpace, TurnLimitedEnv

__all__ = ["MathEnv"]


class MathEnv(RewardMixin, ReferenceMixin, TurnLimitedEnv):
    """Single turn: the observation is ``row["prompt"]``; the reply is scored against ``row["answer"]``.

    ``reward`` names a registered reward (default ``math``: \\boxed{}, ``#### N`` or the last
    number, compared with math-verify). Reward 1.0 means success. A run's settings: ``envs/recipes/math.yaml``.
    """

    default_dataset = "arithmetic"
    action_space = TextSpace(probes=("42", "", "The answer is \\boxed{7}.", "7"))
    required_fields: ClassVar[tuple[str, ...]] = ("prompt", "answer")

    def __init__(self, reward: str = "math") -> None:
        super().__init__(max_turns=1)
        self.reward = reward

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        return _scored(*self.compute_reward(self.reward, action, row))

    async def aplay_turn(self, action: str, row: dict[str, Any]) -> tuple[Observation, float, bool, dict[str, Any]]:
        if type(self).play_turn is not MathEnv.play_turn:  # a subclass's turn runs as it was written
            return await super().aplay_turn(action, row)
        return _scored(*await self.acompute_reward(self.reward, action, row))

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        return str(row["answer"])


def _scored(reward: float, info: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
    info["success"] = reward >= 1.0
    return "", reward, True, info
