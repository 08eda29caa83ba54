"""One owner of the return: agents report per-turn rewards, the rollout discounts them where the
episode ends (``settle_returns``) with the config's ``env.turn_discount`` and the failure policy;
no agent is told γ. Cases computed by hand."""

from __future__ import annotations

from typing import Any

import pytest

from areal_agents import Agent, Env, Trajectory, checked_step
from areal_agents.config import RolloutConfig
from areal_agents.config.loader import load_config
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.registry import agents, envs
from areal_agents.rollout import RolloutExecutor, make_episode_fn
from areal_agents.rollout.returns import settle_returns
from areal_agents.rollout.wiring import build_agent, env_factory, sampling_params
from trainers.batching import collate


def test_discounted_returns_per_turn_by_hand() -> None:
    # rewards 1, 0, 2 with γ = 0.5: G2 = 2, G1 = 0 + 0.5·2 = 1, G0 = 1 + 0.5·1 = 1.5
    traj = settle_returns(Trajectory(turn_rewards=[1.0, 0.0, 2.0]), 0.5)
    assert traj.turn_returns == [1.5, 1.0, 2.0] and traj.reward == 1.5
    assert traj.turn_rewards == [1.0, 0.0, 2.0]  # what the agent reported stays as it was
    # a return computed before (by an agent, with another γ) is overruled; settling twice changes nothing
    traj.reward, traj.turn_returns = 9.0, [9.0, 9.0, 9.0]
    assert settle_returns(settle_returns(traj, 0.5), 0.5).turn_returns == [1.5, 1.0, 2.0] and traj.reward == 1.5
    # γ = 1: plain sums; no per-turn rewards: the agent's own reward stands
    assert settle_returns(Trajectory(turn_rewards=[0.0, 1.0, 1.0])).turn_returns == [2.0, 2.0, 1.0]
    assert settle_returns(Trajectory(reward=0.7), 0.5).reward == 0.7


def test_set_rewards_records_rewards_and_leaves_the_return_unsettled() -> None:
    traj = Trajectory(reward=5.0, turn_returns=[5.0])  # an earlier return, e.g. the agent's own
    traj.set_rewards([1, 2])
    assert (traj.turn_rewards, traj.reward, traj.turn_returns) == ([1.0, 2.0], 0.0, [])
    assert settle_returns(traj, 0.5).turn_returns == [2.0, 2.0] and traj.reward == 2.0


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


class UserAgent(Agent):
    """A user's agent as ``areal-agents run`` builds it: the arguments every agent gets and not one
    more (no ``**kwargs`` that would swallow a turn discount), playing ``max_turns`` turns."""

    def __init__(self, max_turns: int = 4, max_tokens: int = 1024, system_prompt: str | None = None,
                 sampling: dict[str, Any] | None = None) -> None:
        self.max_turns, self.sampling = max_turns, dict(sampling or {})

    async def run(self, env: Env, llm: Any, row: dict[str, Any] | None = None, *, seed: int | None = None) -> Trajectory:
        obs, _ = await env.areset(seed=seed, options=row)
        messages = [{"role": "user", "content": obs}]
        rewards: list[float] = []
        for _ in range(self.max_turns):
            text = await llm.chat(messages, **self.sampling)
            step = await checked_step(env, text)
            rewards.append(step.reward)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": str(step.obs)}]
        traj = llm.to_trajectory()
        traj.set_rewards(rewards)
        return traj


def test_a_user_agent_without_a_turn_discount_is_built_from_config_and_trained_through() -> None:
    agents.register("returns-user-agent")(UserAgent)
    envs.register("returns-countdown")(CountdownEnv)
    try:
        cfg = load_config(None, ["agent.name=returns-user-agent", "env.name=returns-countdown",
                                 "env.turn_discount=0.5", "agent.max_turns=3", "sampling.max_new_tokens=4",
                                 "rollout.batch_size=1", "rollout.group_size=2"])
        agent = build_agent(cfg, sampling_params(cfg))
        assert type(agent) is UserAgent and agent.max_turns == 3 and agent.sampling["max_new_tokens"] == 4
        fn = make_episode_fn(env_factory(cfg), agent, lambda rid: ScriptedLLM(["a", "b", "c"]))
        with RolloutExecutor(cfg.rollout, episode_fn=fn, rows=[{"i": 0}], turn_discount=cfg.env.turn_discount,
                             group_filter=lambda group: True) as ex:
            batch = ex.prepare_batch(timeout=30)
    finally:
        agents.remove("returns-user-agent")
        envs.remove("returns-countdown")
    trajs = [t for g in batch for t in g]
    # rewards 1, 2, 3 with env.turn_discount 0.5: G = [2.75, 3.5, 3]
    assert len(trajs) == 2 and all(t.ok and t.turn_returns == [2.75, 3.5, 3.0] for t in trajs)
    tensors = collate(trajs, pad_token_id=0)  # what the trainer reads: each generated token its turn's return
    assert tensors["rewards"].tolist() == [2.75, 2.75]
    for row, traj in zip(tensors["turn_returns"].tolist(), trajs, strict=True):
        assert [set(row[start:end]) for start, end in traj.turn_spans] == [{2.75}, {3.5}, {3.0}]
