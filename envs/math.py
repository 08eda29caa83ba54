"""``math``: answer one arithmetic (or GSM8K-style) question; reward from the math reward."""

from __future__ import annotations

from typing import Any

from areal_agents.env import Env

__all__ = ["MathEnv"]


class MathEnv(Env):
    """Single turn: the observation is ``row["prompt"]``; the reply is scored against ``row["answer"]``.

    ``reward`` names a registered reward (default ``math``: \\boxed{}, ``#### N`` or the last
    number, compared with math-verify). Reward 1.0 means success.
    """

    default_dataset = "arithmetic"
    default_dataset_kwargs = {}

    def __init__(self, reward: str = "math") -> None:
        self.reward = reward
        self.row: dict[str, Any] | None = None
        self.turn = 0
        self.done = True

    def _start(self, seed: int | None, options: dict[str, Any] | None) -> str:
        super().reset(seed=seed)
        row = self.resolve_row(options, ("prompt", "answer"))
        self.row, self.turn, self.done = row, 0, False
        return str(row["prompt"])

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        return self._start(seed, options), {}

    def _score(self, action: str) -> tuple[float, dict[str, Any]]:
        if self.row is None or self.done:
            raise RuntimeError(f"{type(self).__name__}.step called before reset() or after the episode ended")
        self.turn += 1
        reward, info = self.compute_reward(self.reward, action, self.row)
        info["success"] = reward >= 1.0
        return reward, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reward, info = self._score(action)
        self.done = True
        return "", reward, True, False, info

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        return str(row["answer"])
