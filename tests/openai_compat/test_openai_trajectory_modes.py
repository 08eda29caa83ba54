"""The two trajectory modes of OpenAI-style agents, on hand-computed cases: ``concat`` (one
trajectory per chain of calls whose prompts extend each other) and ``individual`` (one per call,
reward ``R * γ^(calls after it)`` once the rollout settles the episode), chosen per agent (an
attribute) or by ``agent.trajectory_mode``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from areal_agents.config import ConfigError
from areal_agents.config.loader import load_config
from areal_agents.gym.registration import make_env
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.openai_compat.agent import OpenAIAgent
from areal_agents.openai_compat.session import CallRecord
from areal_agents.openai_compat.trajectories import assemble
from areal_agents.rollout.returns import settle_returns
from areal_agents.rollout.wiring import build_agent
from areal_agents.types import Trajectory


def rec(index: int, prompt: list[int], completion: list[int]) -> CallRecord:
    return CallRecord(index=index, prompt_ids=prompt, completion_ids=completion,
                      logprobs=[-0.5 - index] * len(completion), versions=[index] * len(completion),
                      finish_reason="stop")


# a main conversation (calls 0, 1, 3 extend each other) and a sub-agent's call (2) in between
RECORDS = [rec(0, [1, 2], [3, 4]), rec(1, [1, 2, 3, 4, 5], [6]), rec(2, [9, 9], [7]),
           rec(3, [1, 2, 3, 4, 5, 6, 8], [10, 11])]


def settled(records: list[CallRecord], reward: float, gamma: float, mode: str) -> list[Trajectory]:
    """``assemble``'s trajectories as the rollout leaves them: the last one holds the others as
    segments, and the episode's return is settled where it ends with discount ``gamma``."""
    trajs = assemble(records, reward, mode)
    trajs[-1].segments = trajs[:-1]
    settle_returns(trajs[-1], gamma)
    return trajs


def test_concat_chains_extending_calls() -> None:
    sub, main = settled(RECORDS, 2.0, 0.5, "concat")
    assert sub.info["calls"] == [2] and main.info["calls"] == [0, 1, 3]
    assert sub.input_ids == [9, 9, 7] and sub.loss_mask == [0, 0, 1]
    assert main.input_ids == [1, 2, 3, 4, 5, 6, 8, 10, 11]
    assert main.loss_mask == [0, 0, 1, 1, 0, 1, 0, 1, 1]
    assert main.logprobs == [0, 0, -0.5, -0.5, 0, -1.5, 0, -3.5, -3.5]
    assert sub.turn_rewards == [2.0] and sub.reward == 1.0  # earned R; one call after it: 2 * 0.5
    assert main.turn_rewards == [0.0, 0.0, 2.0] and main.turn_returns == [0.5, 1.0, 2.0]


def test_individual_makes_each_call_a_sample_discounted_by_the_calls_after_it() -> None:
    trajs = settled(RECORDS, 2.0, 0.5, "individual")
    assert [t.info["calls"] for t in trajs] == [[0], [1], [2], [3]]
    assert [t.reward for t in trajs] == [0.25, 0.5, 1.0, 2.0]  # 2 * 0.5^3, ^2, ^1, ^0
    for traj, r in zip(trajs, RECORDS, strict=True):
        assert traj.input_ids == r.prompt_ids + r.completion_ids
        assert traj.loss_mask == [0] * len(r.prompt_ids) + [1] * len(r.completion_ids)
        assert traj.versions[len(r.prompt_ids):] == r.versions and traj.turn_spans == [(len(r.prompt_ids),
                                                                                        len(traj.input_ids))]


def test_individual_with_no_discount_gives_every_call_the_reward() -> None:
    assert [t.reward for t in settled(RECORDS[:2], -1.0, 1.0, "individual")] == [-1.0, -1.0]
    with pytest.raises(ValueError, match="concat, individual"):
        assemble(RECORDS, 1.0, "chain")


async def _three_calls(client: Any, row: dict[str, Any]) -> float:
    """A conversation of three calls, each extending the one before."""
    messages: list[dict[str, Any]] = []
    for i in range(3):
        messages.append({"role": "user", "content": f"step {i}"})
        reply = await client.chat.completions.create(model="m", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return 4.0


def _play(agent: OpenAIAgent, tokenizer: Any = None) -> Any:
    llm = ScriptedLLM(["a", "b", "c"], tokenizer)
    return asyncio.run(agent.run(make_env("math"), llm, {"prompt": "1+1=", "answer": "2"}))


@pytest.mark.parametrize("attribute, config, mode", [
    (None, None, "concat"), ("individual", None, "individual"), ("individual", "concat", "concat"),
    (None, "individual", "individual")])
def test_mode_from_the_agent_attribute_or_the_config(attribute: str | None, config: str | None, mode: str) -> None:
    async def agent(client: Any, row: dict[str, Any]) -> float:
        return await _three_calls(client, row)

    if attribute is not None:
        agent.trajectory_mode = attribute  # type: ignore[attr-defined]
    built = OpenAIAgent(agent, trajectory_mode=config)
    assert built.trajectory_mode == mode
    main = settle_returns(_play(built), 0.5)  # env.turn_discount = 0.5, applied where the episode ends
    assert main.status == "ok" and main.info["trajectory_mode"] == mode
    flat = main.flatten()
    if mode == "concat":  # one three-turn sample, returns 4 * 0.5^2, 4 * 0.5, 4
        assert [t.turn_returns for t in flat] == [[1.0, 2.0, 4.0]]
    else:  # three samples, each with its own prompt
        assert [t.reward for t in flat] == [1.0, 2.0, 4.0] and [len(t.turn_spans) for t in flat] == [1, 1, 1]
        assert flat[2].input_ids[: flat[1].num_tokens] == flat[1].input_ids  # its prompt holds the earlier calls


def test_config_field_reaches_the_agent_and_is_checked() -> None:
    cfg = load_config(None, ["agent.name=unit-convert", "agent.trajectory_mode=individual"])
    assert build_agent(cfg, {}).trajectory_mode == "individual"
    assert build_agent(load_config(None, ["agent.name=unit-convert"]), {}).trajectory_mode == "concat"
    with pytest.raises(ConfigError, match="trajectory_mode"):
        load_config(None, ["agent.name=unit-convert", "agent.trajectory_mode=chains"])
    with pytest.raises(ConfigError, match="agent.trajectory_mode: applies to OpenAI-style agents"):
        build_agent(load_config(None, ["agent.name=chat", "agent.trajectory_mode=individual"]), {})
