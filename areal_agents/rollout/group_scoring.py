"""Group rewards: the finished episodes of one row scored together (no torch).

A group reward (:func:`~areal_agents.rewards.builtin.group_reward`, e.g. a
:class:`~areal_agents.rewards.judge.GroupJudge` ranking the replies in one call) is named by
``rollout.group_reward``. When the last episode of a group ends, :func:`score_group` asks it once,
in the run's reward workers, for the final replies of the group's ``ok`` episodes; each score
replaces its episode's last-turn reward (``info["env_reward"]`` keeps the env's) and the return is
settled again (:func:`~areal_agents.rollout.returns.settle_returns`). A call that fails (a reply
the judge's scale cannot read, a timeout) fails those episodes with its status (``reward_error``,
``timeout``): counted, never a silent 0. The eval scores episodes one by one, by the env's reward.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from areal_agents.rollout.returns import settle_returns
from areal_agents.types import Trajectory

if TYPE_CHECKING:
    from areal_agents.rewards import RewardRunner

__all__ = ["GroupScorer", "final_reply", "group_scorer", "score_group"]

GroupScorer = Callable[[dict[str, Any], Sequence[Trajectory]], Awaitable[tuple[float, int]]]
"""``scorer(row, members)``: scores a finished group in place (what the executor awaits); returns the
call's seconds and judge calls."""


def final_reply(traj: Trajectory) -> str:
    """The last assistant message of an episode (``info["messages"]``), what a group reward reads."""
    messages = traj.info.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "assistant":
                return str(message.get("content") or "")
    raise ValueError(f"episode {traj.info.get('episode_id', '?')} records no messages: a group reward reads the "
                     "last assistant message of info['messages'] (ChatAgent and the OpenAI-style agents record them)")


async def score_group(runner: RewardRunner, reward: Any, row: dict[str, Any], members: Sequence[Trajectory], *,
                      turn_discount: float = 1.0, zero_failed: bool = False) -> tuple[float, int]:
    """Score the ``ok`` episodes of ``members`` with the group reward ``reward`` (one call), in place;
    returns the call's seconds and judge calls."""
    scored = [t for t in members if t.ok and t.turn_rewards]
    if not scored:
        return 0.0, 0
    try:
        replies = [final_reply(t) for t in scored]
    except ValueError as exc:
        for traj in scored:
            traj.status, traj.info["error"] = "reward_error", f"group reward: {exc}"
        return 0.0, 0
    result = await runner.acompute(reward, replies, row)
    for traj, value in zip(scored, result.values or [0.0] * len(scored), strict=True):
        traj.info["group_reward_s"] = result.seconds  # the one call's, shared by the group
        if not result.ok:
            traj.status, traj.info["error"] = result.status, f"group reward: {result.error}"
            traj.info["reward_status"] = result.status
        else:
            traj.info["env_reward"], traj.info["group_reward"] = traj.turn_rewards[-1], value
            traj.turn_rewards = [*traj.turn_rewards[:-1], value]
        settle_returns(traj, turn_discount, zero_failed=zero_failed)
    return result.seconds, result.judge_calls


def group_scorer(runner: RewardRunner, reward: str, *, turn_discount: float = 1.0,
                 zero_failed: bool = False) -> GroupScorer:
    """The executor's scorer for the registered group reward ``reward`` (``rollout.group_reward``)."""

    async def scorer(row: dict[str, Any], members: Sequence[Trajectory]) -> tuple[float, int]:
        return await score_group(runner, reward, row, members, turn_discount=turn_discount, zero_failed=zero_failed)

    return scorer
