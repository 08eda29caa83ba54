"""Fault-injection rewards for the rollout tests, in a light module that reward workers import fast."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["addition_reward", "string_reward"]


def addition_reward(completion: str, answer: str = "", hang: bool = False, **row: Any) -> float:
    """Exact-match reward; rows with ``hang`` never return (fault injection: a hanging reward)."""
    if hang:
        time.sleep(3600)
    return float(completion.strip() == answer)


def string_reward(completion: str, **row: Any) -> Any:
    """A user mistake: the reward is a string (fault injection)."""
    return "0.0"
