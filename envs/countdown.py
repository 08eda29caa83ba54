"""``countdown``: combine the given numbers with + - * / to hit a target, over several tries."""

from __future__ import annotations

import ast
import random
from collections import Counter
from fractions import Fraction
from typing import Any

from areal_agents.env import Env

__all__ = ["CountdownEnv", "countdown_dataset", "evaluate_expression"]

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integers it uses.

    Only integers, ``+ - * /`` and parentheses are allowed; anything else raises ``ValueError``.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    used: list[int] = []

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise ValueError("division by zero")
            return left / right
        raise ValueError("only integers, + - * / and parentheses are allowed")

    return ev(tree.body), used


def _in_test_split(numbers: list[int], target: int) -> bool:
    key = 0
    for n in sorted(numbers) + [target]:
        key = (key * 1_000_003 + n) % 4_294_967_311
    return (key * 2_654_435_761) % 4_294_967_296 < 429_496_730  # ~10 %


def countdown_dataset(
    split: str = "train",
    *,
    size: int | None = None,
    seed: int = 0,
    count: int = 3,
    low: int = 1,
    high: int = 10,
) -> list[dict[str, Any]]:
    """Seeded puzzles: ``count`` numbers in ``[low, high]`` and a reachable positive integer target.

    Rows ``{"prompt": "Use 3 5 7 to make 22.", "numbers", "target", "answer": "3*5+7"}`` where
    ``answer`` is one solution. A puzzle (numbers + target) belongs to exactly one split.
    ``size=None`` gives 1000 train / 100 test rows.
    """
    if split not in ("train", "test"):
        raise ValueError(f"countdown_dataset: split must be train or test (got {split!r})")
    if count < 2 or low < 1 or low > high:
        raise ValueError(f"countdown_dataset: need count >= 2 and 1 <= low <= high (got {count}, {low}, {high})")
    n = size if size is not None else (1000 if split == "train" else 100)
    rng = random.Random(f"countdown:{split}:{seed}")
    rows: list[dict[str, Any]] = []
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise ValueError(f"countdown_dataset: cannot make {n} {split} puzzles with these settings")
        numbers = [rng.randint(low, high) for _ in range(count)]
        order = rng.sample(numbers, count)
        expr = str(order[0])
        for x in order[1:]:
            expr += rng.choice("+-*") + str(x)
        value, _ = evaluate_expression(expr)
        if value.denominator != 1 or value <= 0 or _in_test_split(numbers, int(value)) != (split == "test"):
            continue
        target = int(value)
        shown = " ".join(map(str, sorted(numbers)))
        rows.append({"prompt": f"Use {shown} to make {target}.", "numbers": sorted(numbers), "target": target,
                     "answer": expr})
    return rows


class CountdownEnv(Env):
    """Reply with an expression using each given number at most once; the env says what it gives.

    Feedback: ``Invalid expression.``, ``Use only 3 5 7, each once.`` or ``That gives 26, not 22.``
    Hitting the target gives reward 1.0; ``max_turns`` tries truncate the episode.
    """

    default_dataset = "countdown"
    default_dataset_kwargs = {}

    def __init__(self, max_turns: int = 6) -> None:
        if max_turns < 1:
            raise ValueError(f"CountdownEnv: max_turns must be >= 1 (got {max_turns})")
        self.max_turns = max_turns
        self.row: dict[str, Any] | None = None
        self.turn = 0
        self.done = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        row = self.resolve_row(options, ("numbers", "target"))
        row.setdefault("prompt", f"Use {' '.join(map(str, row['numbers']))} to make {row['target']}.")
        self.row, self.turn, self.done = row, 0, False
        return str(row["prompt"]), {}

    def _feedback(self, action: str) -> tuple[str, bool]:
        assert self.row is not None
        lines = [ln for ln in action.strip().splitlines() if ln.strip()]
        text = lines[-1] if lines else ""
        text = text.split("=")[0]
        try:
            value, used = evaluate_expression(text)
        except ValueError:
            return "Invalid expression.", False
        if Counter(used) - Counter(int(x) for x in self.row["numbers"]):
            return f"Use only {' '.join(map(str, self.row['numbers']))}, each once.", False
        if value == int(self.row["target"]):
            return "", True
        shown = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
        return f"That gives {shown}, not {self.row['target']}.", False

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.row is None or self.done:
            raise RuntimeError("CountdownEnv.step called before reset() or after the episode ended")
        self.turn += 1
        obs, success = self._feedback(action)
        info: dict[str, Any] = {"turns": self.turn, "success": success}
        if success:
            self.done = True
            return obs, 1.0, True, False, info
        if self.turn >= self.max_turns:
            self.done = True
            return obs, 0.0, False, True, info
        return obs, 0.0, False, False, info

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        return str(row["answer"]) if row.get("answer") else None
