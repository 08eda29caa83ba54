"""Group rewards: one call scores a finished group (``rollout.group_reward``).

Hand-made groups go through a real :class:`RewardRunner` (worker processes) and a real
:class:`RolloutExecutor`: the scores replace each episode's last-turn reward before the group
is handed out (so the group filter and the advantages see them), the env's reward is kept beside
them, a failing group reward fails the group's episodes with its status (never a silent 0),
and a name that is not a group reward is refused with one line."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest

from areal_agents.config import ConfigError, RolloutConfig
from areal_agents.config.loader import load_config
from areal_agents.registry import register_reward
from areal_agents.rewards import RewardRunner, group_reward
from areal_agents.rollout import RolloutExecutor
from areal_agents.rollout.group_scoring import group_scorer, score_group
from areal_agents.rollout.process import build_group_scorer
from areal_agents.types import Trajectory


@group_reward
def longest_first(completions: list[str], **row: Any) -> list[float]:
    """Ranks the replies by length, longest first: the i-th longest of n scores (n - i) / n."""
    order = sorted(range(len(completions)), key=lambda i: -len(completions[i]))
    scores = [0.0] * len(completions)
    for rank, i in enumerate(order):
        scores[i] = (len(completions) - rank) / len(completions)
    return scores


@group_reward
def wrong_count(completions: list[str], **row: Any) -> list[float]:
    return [1.0]  # one score for a group of several: a reward error


register_reward("test-longest-first", override=True)(longest_first)
register_reward("test-wrong-count", override=True)(wrong_count)
register_reward("test-one-reply", override=True)(lambda completion, **row: 1.0)


def episode(reply: str, env_reward: float = 0.25) -> Trajectory:
    """A finished single-turn episode whose env gave ``env_reward`` (settled by whoever ends it)."""
    n = len(reply) + 1
    t = Trajectory(input_ids=[1, 2] + [5] * n, loss_mask=[0, 0] + [1] * n, logprobs=[0.0, 0.0] + [-0.5] * n,
                   versions=[-1, -1] + [0] * n, turn_spans=[(2, 2 + n)])
    t.set_rewards([env_reward])
    t.info["messages"] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": reply}]
    return t


@pytest.fixture(scope="module")
def runner() -> Any:
    with RewardRunner(timeout=30, max_workers=1) as r:
        yield r


def test_a_group_is_scored_in_one_call_and_keeps_the_env_reward(runner: RewardRunner) -> None:
    group = [episode("aa"), episode("aaaa"), episode("a"), episode("aaa")]
    group.append(episode("aaaaaaaa"))
    group[-1].status = "env_error"  # a failed episode is not sent to the judge, nor changed
    seconds, calls = asyncio.run(score_group(runner, "test-longest-first", {"prompt": "q"}, group))
    assert [t.reward for t in group[:4]] == [0.5, 1.0, 0.25, 0.75]
    assert all(t.info["env_reward"] == 0.25 and t.info["group_reward"] == t.reward for t in group[:4])
    assert group[-1].turn_rewards == [0.25] and "group_reward" not in group[-1].info
    assert seconds > 0 and calls == 0 and runner.stats["ok"] == 1  # one call for the group; a Python reward


def test_a_failing_group_reward_fails_the_groups_episodes(runner: RewardRunner) -> None:
    group = [episode("a"), episode("bb")]
    asyncio.run(score_group(runner, "test-wrong-count", {}, group))
    assert [t.status for t in group] == ["reward_error"] * 2
    assert all("not 2 numbers" in t.info["error"] for t in group)


def test_an_episode_without_messages_is_a_reward_error(runner: RewardRunner) -> None:
    group = [episode("a"), episode("bb")]
    del group[1].info["messages"]
    asyncio.run(score_group(runner, "test-longest-first", {}, group))
    assert [t.status for t in group] == ["reward_error"] * 2 and "records no messages" in group[0].info["error"]


def test_the_executor_hands_out_groups_with_their_group_scores(runner: RewardRunner) -> None:
    """Replies of several lengths: every batch's rewards are the ranks of its groups' lengths, and the
    group filter keeps every group (ranks always differ), though the env's rewards are all equal."""

    async def play(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        await asyncio.sleep(random.random() * 0.01)
        return episode("x" * (1 + seed % 7 + 7 * (seed % 3)))

    rows = [{"prompt": f"{i}"} for i in range(6)]
    cfg = RolloutConfig(batch_size=2, group_size=3, max_concurrent_rollouts=12, group_filter="nonzero_std")
    reward_s = []  # each batch's: the calls finished since the batch before (the executor runs ahead, so one may have none)
    with RolloutExecutor(cfg, episode_fn=play, rows=rows, group_scorer=group_scorer(runner, "test-longest-first")) as ex:
        for _ in range(3):
            for group in ex.prepare_batch(timeout=60):
                lengths = [len(t.info["messages"][-1]["content"]) for t in group]
                assert sorted(t.reward for t in group) == pytest.approx([1 / 3, 2 / 3, 1.0])  # ranks, ties broken
                assert group[lengths.index(max(lengths))].reward == 1.0
                assert all(t.info["env_reward"] == 0.25 for t in group)
            reward_s.append(ex.stats()["time/reward_s"])
        stats = ex.stats()
    assert sum(reward_s) > 0 and min(reward_s) >= 0 and "rollout/dropped_groups/filter" not in stats


@pytest.mark.parametrize(("name", "match"), [("test-one-reply", "scores one reply, not a group"),
                                             ("no-such-reward", "unknown reward")])
def test_a_name_that_is_not_a_group_reward_is_refused(runner: RewardRunner, name: str, match: str) -> None:
    cfg = load_config(None, [f"rollout.group_reward={name}"])
    with pytest.raises(ConfigError, match=match) as err:
        build_group_scorer(cfg, runner)
    assert str(err.value).startswith("rollout.group_reward")


def test_group_scores_drive_the_group_filter(runner: RewardRunner) -> None:
    """Equal env rewards would be dropped by nonzero_std; the group reward's ranks are kept."""
    seen: list[Sequence[float]] = []

    async def play(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        return episode("y" * (seed % 4 + 1))

    cfg = RolloutConfig(batch_size=1, group_size=4, max_concurrent_rollouts=4, group_filter="nonzero_std")
    with RolloutExecutor(cfg, episode_fn=play, rows=[{"prompt": "p"}], seed=0,
                         group_scorer=group_scorer(runner, "test-longest-first")) as ex:
        seen.append([t.reward for t in ex.prepare_batch(timeout=60)[0]])
    assert sorted(seen[0]) == [0.25, 0.5, 0.75, 1.0]


def test_a_group_filter_raising_after_the_group_reward_fails_the_run(runner: RewardRunner) -> None:
    """A failure when a scored group is resolved reaches the trainer, as one in an episode's end does."""

    async def play(row: dict[str, Any], seed: int, episode_id: str) -> Trajectory:
        return episode("z" * (seed % 3 + 1))

    def broken(group: list[Trajectory]) -> bool:
        raise RuntimeError("filter bug")

    cfg = RolloutConfig(batch_size=1, group_size=2, max_concurrent_rollouts=2)
    with RolloutExecutor(cfg, episode_fn=play, rows=[{"prompt": "p"}], group_filter=broken,
                         group_scorer=group_scorer(runner, "test-longest-first")) as ex:
        with pytest.raises(RuntimeError, match="filter bug"):
            ex.prepare_batch(timeout=60)


def test_a_group_reward_given_one_reply_is_a_reward_error_not_a_score_of_its_characters(runner: RewardRunner) -> None:
    # named as an env's reward by mistake, it would score "abc" as the group ["a", "b", "c"]
    result = runner.compute("test-longest-first", "abc", {})
    assert result.status == "reward_error" and "is a group reward" in result.error
    assert "rollout.group_reward" in result.error and "\n" not in result.error
    assert runner.compute("test-longest-first", ["abc", "a"], {}).values == [1.0, 0.5]
