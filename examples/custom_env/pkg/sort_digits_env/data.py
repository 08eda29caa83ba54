"""The ``sort-digits`` dataset: seeded rows ``{"prompt": "sort 7 2 9 4", "answer": "2 4 7 9"}``."""

from __future__ import annotations

import itertools
import random
from typing import Any

__all__ = ["sort_digits_dataset"]


def _is_test(digits: tuple[int, ...], test_fraction: float) -> bool:
    # a fixed hash of the digits, so a problem is in one split whatever the seed or size
    h = 0
    for d in digits:
        h = (h * 1_000_003 + d + 1) % 2_147_483_647
    return (h * 2_654_435_761 % 4_294_967_296) / 4_294_967_296 < test_fraction


def sort_digits_dataset(split: str = "train", *, size: int | None = None, length: int = 4, seed: int = 0,
                        test_fraction: float = 0.1) -> list[dict[str, Any]]:
    """``size`` rows of ``length`` random digits (all of the split's problems once when ``None``).

    Each row: ``prompt`` (``"sort 7 2 9 4"``), ``answer`` (``"2 4 7 9"``) and ``digits``.
    """
    if split not in ("train", "test"):
        raise ValueError(f"sort_digits_dataset: split must be train or test (got {split!r})")
    if not 2 <= length <= 6:
        raise ValueError(f"sort_digits_dataset: length must be in 2..6 (got {length})")
    pool = [d for d in itertools.product(range(10), repeat=length) if _is_test(d, test_fraction) == (split == "test")]
    random.Random(f"sort-digits:{split}:{seed}").shuffle(pool)
    n = len(pool) if size is None else int(size)
    rows = []
    for i in range(n):
        digits = pool[i % len(pool)]
        rows.append({"prompt": "sort " + " ".join(map(str, digits)),
                     "answer": " ".join(map(str, sorted(digits))), "digits": list(digits)})
    return rows
