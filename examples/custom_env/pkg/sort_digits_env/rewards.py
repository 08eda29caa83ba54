"""The ``sort-digits`` reward: partial credit for every digit in its right place."""

from __future__ import annotations

from typing import Any

__all__ = ["sort_digits_reward"]


def sort_digits_reward(completion: str, answer: str = "", **row: Any) -> float:
    """1.0 for exactly the sorted digits; otherwise ``0.5 * (digits in place) / length``.

    The reply is read as whitespace-separated tokens; a reply of the wrong length scores at
    most the matching prefix, so padding or truncating never pays.
    """
    want = answer.split()
    got = completion.split()
    if got == want:
        return 1.0
    if not want:
        return 0.0
    in_place = sum(g == w for g, w in zip(got, want, strict=False))
    return 0.5 * in_place / len(want)
