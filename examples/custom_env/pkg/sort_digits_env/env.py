"""The ``sort-digits`` env: one reply per row, scored by the ``sort-digits`` reward."""

from __future__ import annotations

from typing import Any

from areal_agents import Env

__all__ = ["SortDigitsEnv"]


class SortDigitsEnv(Env):
    """Observation ``"sort 7 2 9 4"``; the reply should be ``"2 4 7 9"``.

    ``reward`` names a registered reward (default ``sort-digits``, partial credit;
    ``exact-match`` gives 0/1). Success means reward 1.0. With ``retries > 0`` a reply that is
    not exactly right gets ``"Not sorted yet."`` and another try.
    """

    default_dataset = "sort-digits"
    default_dataset_kwargs: dict[str, Any] = {"length": 4}

    def __init__(self, reward: str = "sort-digits", retries: int = 0) -> None:
        if retries < 0:
            raise ValueError(f"SortDigitsEnv: retries must be >= 0 (got {retries})")
        self.reward = reward
        self.retries = retries
        self.row: dict[str, Any] | None = None
        self.tries = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.row = self.resolve_row(options, ("prompt", "answer"))  # no row: one drawn from default_dataset
        self.tries = 0
        return str(self.row["prompt"]), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.row is None:
            raise RuntimeError("SortDigitsEnv.step called before reset()")
        self.tries += 1
        reward, info = self.compute_reward(self.reward, action, self.row)
        info["success"] = reward >= 1.0
        if info["success"]:
            return "", reward, True, False, info
        if self.tries > self.retries:
            return "", reward, self.retries == 0, self.retries > 0, info
        return "Not sorted yet.", reward, False, False, info

    def reference_completion(self, row: dict[str, Any]) -> str | None:
        """The sorted digits: the SFT warm start of the tiny default model learns from these."""
        return str(row["answer"])
