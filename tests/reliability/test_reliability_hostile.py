"""Hostile envs and rewards through the real RolloutExecutor + ChatAgent: each fault is contained,
counted under ``rollout/failed/<status>``, and the executor keeps producing good episodes.

The LLM is :class:`~areal_agents.llm.scripted.ScriptedLLM` (a test double that always answers
``42``); the faults are real: exceptions, wrong return types, sync and async hangs, NaN/inf,
``sys.exit`` in an env, and rewards that hang, ``os._exit``, segfault or allocate without
bound inside real reward worker processes.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter
from typing import Any

from reliability_hostile_rewards import hostile_reward
from reliability_support import record, settled_thread_count

from areal_agents.agent import ChatAgent
from areal_agents.config import RolloutConfig
from areal_agents.env import Env, RewardMixin
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.rewards import RewardRunner, default_runner
from areal_agents.rollout import RolloutExecutor, make_episode_fn
from areal_agents.types import Trajectory

RELEASE = threading.Event()  # lets the hung sync steps end when the test is over


class HostileEnv(Env):
    """Fault injection: one-turn env that misbehaves as ``row["kind"]`` says."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.row = dict(options or {})
        if self.row["kind"] == "reset_raise":
            raise KeyError("fault injection: reset crashed")
        return "What is 6 * 7?", {}

    def step(self, action: str) -> Any:
        kind = self.row["kind"] if self.row else "ok"
        if kind == "raise":
            raise RuntimeError("fault injection: step crashed")
        if kind == "exit":
            sys.exit(3)
        if kind == "hang_sync":
            RELEASE.wait(600)
        returns = {
            "none": None, "short": ("", 1.0, True), "obs_int": (42, 1.0, False, False, {}),
            "info_list": ("", 1.0, True, False, ["x"]), "reward_str": ("", "abc", True, False, {}),
            "reward_none": ("", None, True, False, {}), "nan": ("", float("nan"), True, False, {}),
            "inf": ("", float("-inf"), True, False, {}),
        }  # fmt: skip
        if kind in returns:
            return returns[kind]
        return "", float(action.strip() == "42"), True, False, {}

    async def astep(self, action: str) -> Any:
        if self.row and self.row["kind"] == "hang_async":
            await asyncio.sleep(600)
        if self.row and self.row["kind"] == "swallow_cancel":  # a retry loop that eats CancelledError
            while not RELEASE.is_set():
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    pass
        if self.row and self.row["kind"] == "exit_async":
            raise SystemExit(4)
        return await super().astep(action)


EXPECTED = {"raise": "env_error", "exit": "env_error", "exit_async": "env_error", "none": "env_error",
            "short": "env_error", "obs_int": "env_error", "info_list": "env_error", "reward_str": "env_error",
            "reward_none": "env_error", "nan": "env_error", "inf": "env_error", "reset_raise": "env_error",
            "hang_sync": "timeout", "hang_async": "timeout", "swallow_cancel": "timeout", "ok": "ok"}  # fmt: skip


def run_rows(env_cls: type, rows: list[dict[str, Any]], timeout: float) -> tuple[list[Trajectory], dict, dict, float]:
    """Submit one group per row (hostile ones first), wait for all; return trajectories by row order."""
    agent = ChatAgent(max_turns=2, max_tokens=64)
    cfg = RolloutConfig(batch_size=1, group_size=1, max_concurrent_rollouts=64, episode_timeout=timeout,
                        failure_policy="zero")
    fn = make_episode_fn(env_cls, agent, lambda rid: ScriptedLLM(lambda messages: "42"))
    t0 = time.monotonic()
    with RolloutExecutor(cfg, episode_fn=fn, bounded_staleness=False) as ex:
        ids = [ex.submit(row) for row in rows]
        groups = {g[0].group_id: g[0] for g in ex.wait(len(rows), timeout=120)}
        counts, stats = ex.counts(), ex.stats()
    return [groups[i] for i in ids], counts, stats, time.monotonic() - t0


def test_hostile_envs_are_contained_and_counted() -> None:
    hostile = [k for k in EXPECTED if k != "ok"]
    # 8 sync hangs first: more than a default thread pool has threads on a small machine
    rows = [{"kind": "hang_sync"}] * 8 + [{"kind": k} for k in hostile for _ in range(2)] + [{"kind": "ok"}] * 40
    threads0 = settled_thread_count()
    try:
        trajs, counts, stats, seconds = run_rows(HostileEnv, rows, timeout=3.0)
    finally:
        RELEASE.set()
    by_kind: dict[str, Counter] = {}
    for row, traj in zip(rows, trajs, strict=True):
        by_kind.setdefault(row["kind"], Counter())[traj.status] += 1
        assert traj.status == EXPECTED[row["kind"]], (row, traj.status, traj.info.get("error"))
        if traj.ok:
            assert traj.reward == 1.0 and traj.num_generated > 0
        else:
            assert traj.reward == 0.0 and traj.info.get("error")
    n_timeout = sum(1 for r in rows if EXPECTED[r["kind"]] == "timeout")
    n_env = sum(1 for r in rows if EXPECTED[r["kind"]] == "env_error")
    assert counts["submitted"] == len(rows) == counts["accepted"] + counts["failed"] + counts["dropped"]
    assert counts["in_flight"] == 0 and counts["accepted"] == 40
    assert stats["rollout/failed/timeout"] == n_timeout and stats["rollout/failed/env_error"] == n_env
    # hung steps did not starve the 40 good episodes of threads: each of them ended ok within its 3 s timeout
    deadline = time.monotonic() + 5
    while threading.active_count() > threads0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == threads0  # released hangs leave no thread behind
    record("hostile_envs", episodes_submitted=counts["submitted"], accepted=counts["accepted"],
           failed=counts["failed"], failed_env_error=n_env, failed_timeout=n_timeout, seconds=round(seconds, 2),
           kinds=sorted(by_kind))


class RewardEnv(RewardMixin, Env):
    """One-turn env scored by :func:`hostile_reward` in the process-wide reward runner."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.row = dict(options or {})
        return "What is 6 * 7?", {}

    def step(self, action: str) -> Any:
        assert self.row is not None
        reward, info = self.compute_reward(hostile_reward, action, self.row)
        return "", reward, True, False, info


def test_hostile_rewards_are_contained_and_counted() -> None:
    kinds = {"hang": "timeout", "exit": "reward_error", "segfault": "reward_error", "alloc": "reward_error",
             "nan": "reward_error", "inf": "reward_error", "string": "reward_error", "raise": "reward_error"}
    rows = [{"kind": k, "answer": "42"} for k in kinds] + [{"kind": "ok", "answer": "42"}] * 16
    runner = RewardRunner(timeout=10.0, max_workers=2, memory_mb=768)  # generous: worker start-up under load
    with default_runner(runner):
        trajs, counts, stats, seconds = run_rows(RewardEnv, rows, timeout=60)
    for row, traj in zip(rows, trajs, strict=True):
        want = kinds.get(row["kind"], "ok")
        assert traj.status == want, (row, traj.status, traj.info)
        assert traj.reward == (1.0 if want == "ok" else 0.0)
    alloc = trajs[list(kinds).index("alloc")]
    assert "MemoryError" in alloc.info["reward_error"]  # the worker's RLIMIT_AS stopped it
    assert "exit code 3" in trajs[list(kinds).index("exit")].info["reward_error"]
    assert "exit code -11" in trajs[list(kinds).index("segfault")].info["reward_error"]
    assert counts["accepted"] == 16 and counts["failed"] == len(kinds)
    assert stats["rollout/failed/timeout"] == 1 and stats["rollout/failed/reward_error"] == len(kinds) - 1
    assert runner.stats == {"ok": 16, "reward_error": len(kinds) - 1, "timeout": 1}
    record("hostile_rewards", episodes_submitted=counts["submitted"], accepted=counts["accepted"],
           failed=counts["failed"], failed_reward_error=len(kinds) - 1, failed_timeout=1,
           seconds=round(seconds, 2), reward_memory_mb=768)


def test_reward_worker_memory_limit_is_configurable() -> None:
    with RewardRunner(timeout=20, max_workers=1, memory_mb=256) as runner:
        small = runner(hostile_reward, "42", {"answer": "42"})
        big = runner(hostile_reward, "x", {"kind": "alloc"})
        after = runner(hostile_reward, "42", {"answer": "42"})
    assert small.ok and small.value == 1.0
    assert big.status == "reward_error" and "raised MemoryError" in big.error  # not its 20 s timeout
    assert after.ok and after.value == 1.0  # the same worker keeps serving
    assert RewardRunner().memory_mb == 4096
    for bad in (0, -5):
        try:
            RewardRunner(memory_mb=bad)
        except ValueError as exc:
            assert "memory_mb" in str(exc)
        else:
            raise AssertionError("memory_mb <= 0 was accepted")
