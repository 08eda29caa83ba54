"""``math``: answer one arithmetic (or GSM8K-style) question; reward from the math reward."""

from __future__ import annotations

from typing import Any, ClassVar

from areal_agents.env import Observation, TurnLimitedEnv

__all__ = ["MathEnv"]


class MathEnv(TurnLimitedEnv):
    """Single turn: the observation is ``row["prompt"]``; the reply is scored against ``row["answer"]``.

    ``reward`` names a registered reward (default ``math``: \\boxed{}, ``#### N`` or the last
    number, compared with math-verify). Reward 1.0 means success.
    """

    default_dataset = "arithmetic"
    default_config: ClassVar[dict[str, Any]] = {
        # A warm start past the middle of the SFT jump, 200 RL steps, and only groups whose
        # samples disagree in the batch: each seed then ends near or above 0.85 greedy accuracy
        # (docs/benchmarks.md, "What limits RL on the tiny model"); rows whose last group every sample
        # solved are mostly skipped, so late in a run generation is not spent on sums the model
        # has learnt (rows no sample solved keep coming: they are what is left to learn). The SFT
        # curve stays flat for ~450 steps, then rises over ~40 (0.2 -> 0.55): checks every 20
        # steps while far below the target. An eval costs about 4 RL steps, a checkpoint half a
        # step: fewer of them.
        "sft": {"warm_start_target": 0.55, "warm_start_far_check_every": 20},
        "rollout": {"group_filter": "nonzero_std", "skip_no_signal": 0.97},
        "trainer": {"total_steps": 200, "save_every": 50},
        "eval": {"every": 50},
    }
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
