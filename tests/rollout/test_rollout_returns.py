"""One owner of the return: agents report per-turn rewards, the rollout discounts them where the
episode ends (``settle_returns``), with the failure policy; cases computed by hand."""

from __future__ import annotations

from typing import Any

import pytest

from areal_agents import Agent, Env, Trajectory, checked_step
from areal_agents.config import RolloutConfig
from areal_agents.rollout import RolloutExecutor, make_episode_fn
from areal_agents.rollout.returns import settle_returns
from areal_agents.testing import ScriptedLLM


def test_discounted_returns_per_turn_by_hand() -> None:
    # rewards 1, 0, 2 with γ = 0.5: G2 = 2, G1 = 0 + 0.5·2 = 1, G0 = 1 + 0.5·1 = 1.5
    traj = settle_returns(Trajectory(turn_rewards=[1.0, 0.0, 2.0]), 0.5)
    assert traj.turn_returns == [1.5, 1.0, 2.0] and traj.reward == 1.5
    assert traj.turn_rewards == [1.0, 0.0, 2.0]  # what the agent reported stays as it was
    # a return computed before (by an agent, with another γ) is overruled; settling twice changes nothing
    traj.set_rewards([1.0, 0.0, 2.0], 0.9)
    assert settle_returns(settle_returns(traj, 0.5), 0.5).turn_returns == [1.5, 1.0, 2.0]
    # γ = 1: plain sums; no per-turn rewards: the agent's own reward stands
    assert settle_returns(Trajectory(turn_rewards=[0.0, 1.0, 1.0])).turn_returns == [2.0, 2.0, 1.0]
    assert settle_returns(Trajectory(reward=0.7), 0.5).reward == 0.7


def test_zero_failure_policy_by_hand() -> None:
    failed = Trajectory(turn_rewards=[1.0, 1.0], status="env_error", segments=[Trajectory(turn_rewards=[3.0])])
    settle_returns(failed, 0.5, zero_failed=True)
    assert (failed.reward, failed.turn_rewards, failed.turn_returns) == (0.0, [0.0, 0.0], [0.0, 0.0])
    assert failed.segments[0].reward == 0.0 and failed.segments[0].turn_returns == [0.0]
    # without the policy (or for an ok episode) the rewards count: 1 + 0.5·1
    kept = settle_returns(Trajectory(turn_rewards=[1.0, 1.0], status="env_error"), 0.5)
    assert kept.reward == 1.5
    ok = settle_returns(Trajectory(turn_rewards=[1.0, 1.0]), 0.5, zero_failed=True)
    assert ok.reward == 1.5


def test_segments_are_discounted_by_the_calls_after_them() -> None:
    # calls 0, 1 in segment A; 2, 3 in the episode's trajectory; R = 4 earned on each last turn
    seg = Trajectory(turn_rewards=[0.0, 4.0], info={"calls": [0, 1]})
    main = Trajectory(turn_rewards=[0.0, 4.0], info={"calls": [2, 3]}, segments=[seg])
    settle_returns(main, 0.5)
    assert main.turn_returns == [2.0, 4.0] and main.reward == 2.0  # γR, R
    assert seg.turn_returns == [0.5, 1.0] and seg.reward == 0.5  # γ³R, γ²R: two calls come after it
    assert seg.turn_rewards == [0.0, 4.0]  # reported rewards kept: settling again gives the same
    assert settle_returns(main, 0.5).segments[0].turn_returns == [0.5, 1.0]


class CountdownEnv(Env):
    """Three turns, reward = the turn number (1, 2, 3) whatever the reply."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return "go", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return f"turn {self.t}", float(self.t), self.t == 3, False, {}


class RecordingAgent(Agent):
    """A custom agent that only records per-turn rewards: it never hears of a discount."""

    async def run(self, env: Env, llm: Any, row: dict[str, Any] | None = None, *, seed: int | None = None) -> Trajectory:
        obs, _ = await env.areset(seed=seed, options=row)
        messages = [{"role": "user", "content": obs}]
        rewards: list[float] = []
        for _ in range(3):
            text = await llm.chat(messages)
            step = await checked_step(env, text)
            rewards.append(step.reward)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": str(step.obs)}]
        return llm.to_trajectory(turn_rewards=rewards)  # no reward, no turn_returns


@pytest.mark.parametrize("policy", ["drop", "zero"])
def test_a_custom_agent_that_only_records_rewards_gets_the_runs_returns(policy: str) -> None:
    # rewards 1, 2, 3 with γ = 0.5: G = [1 + 0.5·2 + 0.25·3, 2 + 0.5·3, 3] = [2.75, 3.5, 3]
    fn = make_episode_fn(CountdownEnv, RecordingAgent(), lambda rid: ScriptedLLM(["a", "b", "c"]))
    cfg = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=4, failure_policy=policy)
    with RolloutExecutor(cfg, episode_fn=fn, rows=[{"i": 0}, {"i": 1}], turn_discount=0.5,
                         group_filter=lambda group: True) as ex:
        batch = ex.prepare_batch(timeout=30)
    trajs = [t for g in batch for t in g]
    assert len(trajs) == 4 and all(t.ok for t in trajs)
    assert all(t.turn_returns == [2.75, 3.5, 3.0] and t.reward == 2.75 for t in trajs)
