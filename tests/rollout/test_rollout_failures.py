"""Failures during a run keep their real cause and name the component: env, agent, reward, server."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from rollout_fault_rewards import string_reward

from areal_agents.agent import Agent, ChatAgent
from areal_agents.config import RolloutConfig
from areal_agents.config.loader import load_config
from areal_agents.env import Env, RewardMixin
from areal_agents.llm.scripted import CharTokenizer, ScriptedLLM
from areal_agents.registry import envs
from areal_agents.rewards import RewardRunner, default_runner
from areal_agents.rollout import EpisodesFailed, RolloutExecutor, make_episode_fn
from areal_agents.rollout.evaluation import evaluate

ROWS = [{"prompt": f"say {i}", "answer": str(i)} for i in range(4)]
CONFIG = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=4)


class StringRewardEnv(RewardMixin, Env):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.row = dict(options or {})
        return self.row["prompt"], {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reward, info = self.compute_reward(string_reward, action, self.row or {})
        return "", reward, True, False, {**info, "success": reward == 1.0}


class ResetFails(StringRewardEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        raise FileNotFoundError("tasks.json")


class SloppyAgent(Agent):
    async def run(self, env: Any, llm: Any, row: Any = None, *, seed: int | None = None) -> Any:
        await env.areset(seed=seed, options=row)
        return llm.to_trajectory(info={"turns": self.max_turns})  # never set: an agent bug


def _streak_error(env_cls: type, agent: Any) -> str:
    fn = make_episode_fn(env_cls, agent, lambda rid: ScriptedLLM(["1"]))
    with RolloutExecutor(CONFIG, episode_fn=fn, rows=ROWS, max_failed_streak=3) as ex:
        with pytest.raises(EpisodesFailed) as err:
            ex.prepare_batch(timeout=60)
    return str(err.value)


def test_a_string_reward_is_named_with_its_cause() -> None:
    with default_runner(RewardRunner(timeout=20, max_workers=1)):
        message = _streak_error(StringRewardEnv, ChatAgent(max_turns=1))
    assert re.search(r"every episode of the last \d+ groups failed", message)
    assert "last cause: reward: reward 'string_reward' returned str '0.0', not a number" in message
    assert "(rollout_fault_rewards.py:" in message and "check the reward function" in message


def test_an_agent_bug_is_blamed_on_the_agent_not_the_env() -> None:
    message = _streak_error(StringRewardEnv, SloppyAgent())
    assert "last cause: agent: AttributeError: 'SloppyAgent' object has no attribute 'max_turns'" in message
    assert "(test_rollout_failures.py:" in message and "check the agent" in message and "check the env" not in message


def test_an_env_bug_inside_a_custom_agent_is_blamed_on_the_env() -> None:
    fn = make_episode_fn(ResetFails, SloppyAgent(), lambda rid: ScriptedLLM(["1"]))
    traj = asyncio.run(fn(ROWS[0], 1, "ep"))
    assert traj.status == "env_error" and "FileNotFoundError: tasks.json (test_rollout_failures.py:" in traj.info["error"]


def test_an_eval_where_every_episode_failed_stops_with_the_cause() -> None:
    envs.register("failures-reset-fails")(ResetFails)
    try:
        cfg = load_config(overrides=["env.name=failures-reset-fails", "data.name=arithmetic"])
        with pytest.raises(EpisodesFailed, match=r"eval: all 3 episodes failed; last cause: env: reset: "
                                                 r"FileNotFoundError: tasks.json; check the env"):
            asyncio.run(evaluate(cfg, CharTokenizer(), None, ROWS[:3]))
    finally:
        envs.remove("failures-reset-fails")
