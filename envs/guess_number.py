"""``guess-number``: find a hidden number with higher/lower feedback, in as few turns as possible."""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from areal_agents.env import ReferenceMixin, TextSpace, TurnLimitedEnv

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


def _fill_defaults(row: dict[str, Any]) -> str:
    """Give ``row`` its default range (1-100) and prompt where it has none; return the prompt."""
    row.setdefault("low", 1)
    row.setdefault("high", 100)
    row.setdefault("prompt", f"Guess my number ({row['low']}-{row['high']}).")
    return str(row["prompt"])


def _feedback(guess: int, target: int) -> str:
    return "Higher." if guess < target else "Lower."


class GuessNumberEnv(ReferenceMixin, TurnLimitedEnv):
    """Each reply's last integer is a guess; the env answers ``Higher.`` or ``Lower.``.

    Success gives reward ``1 - 0.5 * (turns - 1) / max_turns`` (fewer turns, more reward); a
    reply without a number gets ``Reply with one number.``; ``max_turns`` guesses truncate. A run's
    settings: ``envs/recipes/guess-number.yaml``.
    """

    default_dataset = "guess-number"
    # 1-30 (bisection needs at most 5 guesses). On 1-100 the tiny model's warm start memorises the
    # top of the bisection tree only, and RL cannot find the deeper guesses by sampling: greedy
    # success fell from 0.42 to 0.34 in 60 steps (seed 1, 2026-12-04). Pass high=100 for the classic game.
    default_dataset_kwargs: ClassVar[dict[str, Any]] = {"high": 30}
    # The agent may make as many guesses as the env allows (the default 4 would cut games short).
    default_config: ClassVar[dict[str, Any]] = {"agent": {"max_turns": 7}}
    action_space = TextSpace(probes=("50", "", "25", "I guess 75.", "Higher?"))
    required_fields = ("target",)

    def __init__(self, max_turns: int = 7) -> None:
        super().__init__(max_turns)

    def start(self, row: dict[str, Any]) -> str:
        prompt = _fill_defaults(row)
        self.left = (int(row["low"]), int(row["high"]))  # what the feedback so far leaves possible
        return prompt

    @staticmethod
    def _narrowed(left: tuple[int, int], guess: int, target: int) -> tuple[int, int]:
        """The numbers still possible after ``guess`` was answered ``Higher.`` or ``Lower.``."""
        low, high = left
        return (max(low, guess + 1), high) if guess < target else (low, min(high, guess - 1))

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        numbers = _INT.findall(action)
        if not numbers:
            return "Reply with one number.", 0.0, False, {"state_key": self._state_key()}
        guess, target = _guess(numbers[-1]), int(row["target"])
        if guess == target:
            return "", 1.0 - 0.5 * (self.turn - 1) / self.max_turns, True, {"success": True}
        self.left = self._narrowed(self.left, guess, target)
        return _feedback(guess, target), 0.0, False, {"state_key": self._state_key()}

    def _state_key(self) -> str:
        """The state the next guess acts in (for step-level credit, ``algorithm.name=gigpo``): the
        numbers still possible; "Higher." alone would not tell two points of the game apart."""
        return f"{self.left[0]}-{self.left[1]}"

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        """The bisection opening: the middle of the range."""
        return str((int(row.get("low", 1)) + int(row.get("high", 100))) // 2)

    def reference_conversation(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A whole bisection game: guess the middle of what is left until the number is found
        (at most ``ceil(log2(high - low + 2))`` guesses: 7 for 1-100)."""
        row = dict(row)
        prompt = _fill_defaults(row)  # the episode's first observation (no episode of this env is touched)
        left, target = (int(row["low"]), int(row["high"])), int(row["target"])
        conv: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        while True:
            guess = sum(left) // 2
            conv.append({"role": "assistant", "content": str(guess)})
            if guess == target:
                return conv
            left = self._narrowed(left, guess, target)
            conv.append({"role": "user", "content": _feedback(guess, target)})
