"""make_episode_fn (env + ChatAgent + LLM, errors to statuses) and executor policies on top of it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from areal_agents.agent import ChatAgent
from areal_agents.config import RolloutConfig
from areal_agents.env import Env
from areal_agents.inference.client import InferenceError
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.rollout import EpisodesFailed, RolloutExecutor, make_episode_fn
from areal_agents.types import Trajectory

ROWS = [{"a": i, "b": i + 1} for i in range(6)]


class AddEnv(Env):
    """Two-turn addition: the first reply gets a hint, the second is graded (reward 1 or 0)."""

    closed = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.row = dict(options or {})
        self.turn = 0
        return f"{self.row['a']}+{self.row['b']}=?", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        assert self.row is not None
        self.turn += 1
        if self.turn == 1:
            return "try again", 0.0, False, False, {}
        ok = action.strip() == str(self.row["a"] + self.row["b"])
        return "", float(ok), True, False, {"success": ok}

    def close(self) -> None:
        type(self).closed += 1


def answer(messages: list[dict[str, Any]]) -> str:
    a, b = messages[0]["content"].rstrip("=?").split("+")
    return str(int(a) + int(b))


class FailingLLM(ScriptedLLM):
    """Fault injection: generation raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(["unused"])
        self.exc = exc

    async def _generate(self, input_ids: list[int], sampling: dict[str, Any]) -> Any:
        raise self.exc


def run(fn: Any, row: dict[str, Any] = ROWS[1], seed: int = 3, eid: str = "ep-0") -> Trajectory:
    return asyncio.run(fn(row, seed, eid))


def test_episode_plays_env_with_agent_and_closes_it():
    AddEnv.closed = 0
    fn = make_episode_fn(AddEnv, ChatAgent(max_turns=3), lambda rid: ScriptedLLM(answer))
    traj = run(fn)
    traj.validate()
    assert traj.ok and traj.num_turns == 2 and traj.turn_rewards == [0.0, 1.0]  # settled where the episode ends
    assert traj.num_generated > 0 and AddEnv.closed == 1


@pytest.mark.parametrize(("exc", "status"), [
    (aiohttp.ClientConnectionError("refused"), "server_error"),
    (InferenceError("/generate failed after 4 attempts"), "server_error"),
    (ConnectionResetError("reset"), "server_error"),
    (ValueError("agent bug"), "agent_error"),
])
def test_exceptions_become_statuses(exc, status):
    AddEnv.closed = 0
    fn = make_episode_fn(AddEnv, ChatAgent(max_turns=2), lambda rid: FailingLLM(exc))
    traj = run(fn)
    assert traj.status == status and type(exc).__name__ in traj.info["error"]
    assert AddEnv.closed == 1


def test_episode_timeout_and_cancellation_close_the_env():
    generating: list[int] = []

    class SlowLLM(ScriptedLLM):
        async def _generate(self, input_ids, sampling):
            generating.append(1)
            await asyncio.sleep(3600)

    AddEnv.closed = 0
    fn = make_episode_fn(AddEnv, ChatAgent(), lambda rid: SlowLLM(["x"]), episode_timeout=0.05)
    traj = run(fn)
    assert traj.status == "timeout" and "0.05" in traj.info["error"] and AddEnv.closed == 1

    async def cancel_midway() -> None:
        generating.clear()
        task = asyncio.ensure_future(make_episode_fn(AddEnv, ChatAgent(), lambda rid: SlowLLM(["x"]))(ROWS[0], 1, "e"))
        while not generating and not task.done():  # midway: the env is open and the agent waits on the LLM
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    assert AddEnv.closed == 2


def test_llm_gets_the_episode_id_as_rid():
    rids: list[str] = []

    def factory(rid: str) -> ScriptedLLM:
        rids.append(rid)
        return ScriptedLLM(answer)

    c = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=4, max_head_offpolicyness=0)
    with RolloutExecutor(c, episode_fn=make_episode_fn(AddEnv, ChatAgent(max_turns=3), factory), rows=ROWS) as ex:
        batch = ex.prepare_batch(timeout=20)
    ids = [t.info["episode_id"] for g in batch for t in g]
    assert set(ids) <= set(rids) and len(set(ids)) == 4
    assert all(t.reward == 1.0 and t.num_turns == 2 for g in batch for t in g)


def test_zero_policy_keeps_failed_episodes_with_reward_zero_and_turn_discount_applies():
    async def episode(row, seed, episode_id):
        if seed % 2:
            raise RuntimeError("fault injection: env crashed")
        traj = await make_episode_fn(AddEnv, ChatAgent(max_turns=3), lambda rid: ScriptedLLM(answer))(
            row, seed, episode_id)
        return traj

    c = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=4, failure_policy="zero")
    with RolloutExecutor(c, episode_fn=episode, rows=ROWS, turn_discount=0.5) as ex:
        batch = ex.prepare_batch(timeout=20)
        stats, counts = ex.stats(), ex.counts()
    trajs = [t for g in batch for t in g]
    failed = [t for t in trajs if not t.ok]
    assert failed and all(t.status == "env_error" and t.reward == 0.0 for t in failed)
    assert all(t.reward == 0.5 for t in trajs if t.ok)  # [0, 1] discounted by 0.5
    assert stats["rollout/failed/env_error"] == counts["failed"] >= len(failed)
    assert counts["submitted"] == counts["accepted"] + counts["failed"] + counts["dropped"] + counts["in_flight"]


def test_a_raising_group_filter_fails_waiters_instead_of_hanging():
    def bad_filter(group: list[Trajectory]) -> bool:
        raise ZeroDivisionError("bad filter")

    c = RolloutConfig(batch_size=1, group_size=2, max_concurrent_rollouts=4)
    fn = make_episode_fn(AddEnv, ChatAgent(max_turns=3), lambda rid: ScriptedLLM(answer))
    with RolloutExecutor(c, episode_fn=fn, rows=ROWS, group_filter=bad_filter) as ex:
        with pytest.raises(RuntimeError, match="bad filter"):
            ex.prepare_batch(timeout=20)


def test_everything_failing_raises_with_the_last_error():
    fn = make_episode_fn(AddEnv, ChatAgent(max_turns=2),
                         lambda rid: FailingLLM(InferenceError("/generate failed after 4 attempts (127.0.0.1:1)")))
    c = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=8)
    with RolloutExecutor(c, episode_fn=fn, rows=ROWS, max_failed_streak=5) as ex:
        with pytest.raises(EpisodesFailed, match=r"last \d+ groups failed; last cause: server: InferenceError.*"
                                                 r"check the inference servers"):
            ex.prepare_batch(timeout=20)
        counts = ex.counts()
    assert counts["failed"] >= 10 and counts["accepted"] == 0


def test_batches_report_the_share_of_groups_with_learning_signal():
    c = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=4, max_head_offpolicyness=0)
    same = make_episode_fn(AddEnv, ChatAgent(max_turns=3), lambda rid: ScriptedLLM(answer))
    with RolloutExecutor(c, episode_fn=same, rows=ROWS) as ex:  # every episode solves it: equal rewards
        ex.prepare_batch(timeout=20)
        assert ex.stats()["rollout/signal_groups"] == 0.0
    mixed = make_episode_fn(AddEnv, ChatAgent(max_turns=3),  # the first episode of each group solves it
                            lambda rid: ScriptedLLM(answer if rid.endswith("-0") else ["x", "x"]))
    with RolloutExecutor(c, episode_fn=mixed, rows=ROWS) as ex:
        batch = ex.prepare_batch(timeout=20)
        assert sorted(t.reward for g in batch for t in g) == [0.0, 0.0, 1.0, 1.0]
        assert ex.stats()["rollout/signal_groups"] == 1.0
