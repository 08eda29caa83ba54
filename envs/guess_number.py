"""``guess-number``: find a hidden number with higher/lower feedback, in as few turns as possible."""

from __future__ import annotations

import random
import re
from typing import Any

from areal_agents.env import Env

__all__ = ["GuessNumberEnv", "guess_number_dataset"]

_INT = re.compile(r"-?\d+")
_MAX_DIGITS = 30  # longer numbers are clamped: int() refuses > 4300 digits, and no target is that big


def _guess(text: str) -> int:
    """The integer in ``text`` (a ``_INT`` match), clamped to ±10**30."""
    if len(text.lstrip("-")) > _MAX_DIGITS:
        return -(10**_MAX_DIGITS) if text.startswith("-") else 10**_MAX_DIGITS
    return int(text)


def guess_number_dataset(
    split: str = "train", *, size: int | None = None, seed: int = 0, low: int = 1, high: int = 100
) -> list[dict[str, Any]]:
    """Rows ``{"prompt", "target", "answer", "low", "high"}``; targets drawn with a per-split seed.

    ``size=None`` gives every target in ``[low, high]`` once, shuffled. (The target range is
    shared by both splits: the game, not the number, is what is learned.)
    """
    if split not in ("train", "test"):
        raise ValueError(f"guess_number_dataset: split must be train or test (got {split!r})")
    if low >= high:
        raise ValueError(f"guess_number_dataset: low must be < high (got {low}, {high})")
    rng = random.Random(f"guess-number:{split}:{seed}")
    targets = list(range(low, high + 1))
    rng.shuffle(targets)
    if size is not None:
        targets = [targets[i] if i < len(targets) else rng.randint(low, high) for i in range(size)]
    return [
        {"prompt": f"Guess my number ({low}-{high}).", "target": t, "answer": str(t), "low": low, "high": high}
        for t in targets
    ]


class GuessNumberEnv(Env):
    """Each reply's last integer is a guess; the env answers ``Higher.`` or ``Lower.``.

    Success gives reward ``1 - 0.5 * (turns - 1) / max_turns`` (fewer turns, more reward); a
    reply without a number gets ``Reply with one number.``; ``max_turns`` guesses truncate.
    """

    default_dataset = "guess-number"
    default_dataset_kwargs = {}

    def __init__(self, max_turns: int = 7) -> None:
        if max_turns < 1:
            raise ValueError(f"GuessNumberEnv: max_turns must be >= 1 (got {max_turns})")
        self.max_turns = max_turns
        self.row: dict[str, Any] | None = None
        self.turn = 0
        self.done = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        row = self.resolve_row(options, ("target",))
        row.setdefault("low", 1)
        row.setdefault("high", 100)
        row.setdefault("prompt", f"Guess my number ({row['low']}-{row['high']}).")
        self.row, self.turn, self.done = row, 0, False
        return str(row["prompt"]), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.row is None or self.done:
            raise RuntimeError("GuessNumberEnv.step called before reset() or after the episode ended")
        self.turn += 1
        target = int(self.row["target"])
        numbers = _INT.findall(action)
        info: dict[str, Any] = {"turns": self.turn, "success": False}
        if not numbers:
            obs = "Reply with one number."
        else:
            guess = _guess(numbers[-1])
            if guess == target:
                self.done = True
                info["success"] = True
                return "", 1.0 - 0.5 * (self.turn - 1) / self.max_turns, True, False, info
            obs = "Higher." if guess < target else "Lower."
        if self.turn >= self.max_turns:
            self.done = True
            return obs, 0.0, False, True, info
        return obs, 0.0, False, False, info

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        """The bisection opening: the middle of the range."""
        return str((int(row.get("low", 1)) + int(row.get("high", 100))) // 2)
