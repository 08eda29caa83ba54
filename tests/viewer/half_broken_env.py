"""A user's env file for ``areal-agents run ... imports=[half_broken_env.py]`` (the viewer's real-run
test): one-turn sums, half of whose rows (odd sums; not the first, which the preflight check plays)
raise in ``step``, so a run has failed episodes to find; the others are rewarded by a hash of the
reply, so samples of one prompt differ."""

from __future__ import annotations

from typing import Any

from areal_agents import register_dataset, register_env
from areal_agents.env import TurnLimitedEnv

ROWS = [{"prompt": f"What is {a} + {b}?", "answer": "fail" if (a + b) % 2 else str(a + b)}
        for a in range(1, 5) for b in range(1, 5)]


@register_dataset("half-broken-rows")
def half_broken_rows(split: str = "train") -> list[dict[str, Any]]:
    return [dict(r) for r in ROWS]


@register_env("half-broken")
class HalfBrokenEnv(TurnLimitedEnv):
    default_dataset = "half-broken-rows"
    required_fields = ("prompt", "answer")

    def __init__(self) -> None:
        super().__init__(max_turns=1)

    def play_turn(self, action: str, row: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        if row["answer"] == "fail":
            raise ValueError("planted env failure")
        return "", sum(map(ord, action)) % 7 / 7, True, {"success": action.strip() == row["answer"]}
