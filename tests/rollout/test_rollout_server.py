"""RolloutExecutor against a real embedded inference server subprocess and a real agent stack.

Episodes are ``ChatAgent`` + ``ClientLLM`` + ``InferenceClient`` on the tiny Qwen2 model
served by ``areal_agents.inference.server`` on loopback; weights change through
``/update_weights_from_disk``. The only fake is ``FlakyAdditionEnv``, a fault-injection env.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rollout_fault_rewards import addition_reward
from rollout_support import other_threads, threads_drained

from areal_agents.agent import ChatAgent
from areal_agents.config import ExperimentConfig, RolloutConfig
from areal_agents.env import Env, RewardMixin
from areal_agents.inference import control
from areal_agents.inference.client import InferenceClient
from areal_agents.inference.launcher import ServerHandle, launch_servers
from areal_agents.llm import ClientLLM
from areal_agents.rewards import RewardRunner, default_runner
from areal_agents.rollout import RolloutExecutor, make_episode_fn
from areal_agents.types import Trajectory
from trainers.rollout_only import write_rollouts


def corpus(n: int = 200) -> Iterator[str]:
    rng = random.Random(0)
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>\n"


class FlakyAdditionEnv(RewardMixin, Env):
    """Fault injection: one-turn addition whose ``step`` raises 20% of the time (seeded)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.row = dict(options or {})
        return f"What is {self.row['a']} + {self.row['b']}?", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        assert self.row is not None
        if self.np_random.random() < self.fault_rate:
            raise RuntimeError("fault injection: env crashed")
        reward, info = self.compute_reward(addition_reward, action, self.row)
        return "", reward, True, False, info

    fault_rate = 0.2


_rng = random.Random(1)
ROWS = [{"a": a, "b": b, "answer": str(a + b), "hang": i % 6 == 5}
        for i, (a, b) in enumerate((_rng.randint(0, 99), _rng.randint(0, 99)) for _ in range(18))]


@pytest.fixture(scope="module")
def models(tiny_model: Callable[..., Path]) -> tuple[Path, Path]:
    return tiny_model(corpus(), seed=0), tiny_model(corpus(), seed=1)


@pytest.fixture(scope="module")
def server(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    cfg = ExperimentConfig()
    cfg.inference.max_batch_size = 32
    with launch_servers(cfg, models[0], 1, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"OMP_NUM_THREADS": "1"}) as group:
        yield group[0]


@pytest.fixture(scope="module")
def tokenizer(models: tuple[Path, Path]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models[0])


@pytest.fixture
def reward_runner() -> Iterator[RewardRunner]:
    with default_runner(RewardRunner(timeout=0.5, max_workers=2)) as runner:
        yield runner


@pytest.fixture
def at_version_0(server: ServerHandle, models: tuple[Path, Path]) -> Iterator[None]:
    control.update_weights_from_disk(server.address, str(models[0]), 0)
    yield


def episode_fn(tokenizer: Any, client: InferenceClient, sampling: dict[str, Any], env_cls: type = FlakyAdditionEnv,
               timeout: float = 60.0) -> Any:
    agent = ChatAgent(max_turns=1, max_tokens=sampling["max_new_tokens"], sampling=sampling)
    return make_episode_fn(env_cls, agent, lambda rid: ClientLLM(tokenizer, client, rid=rid, default_sampling=sampling),
                           episode_timeout=timeout)


def gen_versions(traj: Trajectory) -> list[int]:
    return [v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m]


def test_faults_staleness_and_weight_updates(server, models, tokenizer, reward_runner, at_version_0):
    """env raising 20%, a hanging reward, weight updates each step: bound and accounting hold."""
    client = InferenceClient([server.address])
    sampling = {"max_new_tokens": 8, "temperature": 1.0}
    cfg = RolloutConfig(batch_size=4, group_size=2, max_concurrent_rollouts=16, max_head_offpolicyness=1,
                        failure_policy="drop", episode_timeout=60.0)
    snapshots: list[dict[str, int]] = []
    stop = threading.Event()
    ex = RolloutExecutor(cfg, episode_fn=episode_fn(tokenizer, client, sampling), rows=ROWS, seed=3,
                         on_shutdown=[client.aclose])

    def sample() -> None:
        while not stop.is_set():
            snapshots.append(ex.counts())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    with ex:
        sampler.start()
        for t in range(4):
            seen, deadline = len(snapshots), time.monotonic() + 60
            batch = ex.prepare_batch(timeout=120)
            while len(snapshots) < seen + 13 and time.monotonic() < deadline:  # the sampler saw this step
                time.sleep(0.002)
            assert len(batch) == 4
            for group in batch:
                assert len(group) == 2 and len({tr.info["seed"] for tr in group}) == 2
                for tr in group:
                    assert tr.ok and tr.num_generated > 0
                    assert tr.start_version >= t - 1  # the staleness guarantee
                    v = gen_versions(tr)
                    assert tr.start_version <= min(v) and max(v) <= t and v == sorted(v)
            ex.pause()
            control.update_weights_from_disk(server.address, str(models[(t + 1) % 2]), t + 1)
            ex.set_version(t + 1)
            ex.resume()
        stats = ex.stats()
    stop.set()
    sampler.join()
    final = ex.counts()
    for c in [*snapshots, final]:
        assert c["submitted"] == c["accepted"] + c["failed"] + c["dropped"] + c["in_flight"], c
    assert len(snapshots) > 50 and final["in_flight"] == 0
    assert stats["rollout/failed/env_error"] >= 1  # the env crashed ...
    hangs = stats.get("rollout/failed/timeout", 0) + stats.get("rollout/failed/reward_error", 0)
    assert hangs >= 1  # ... and the hanging reward was cut off, never stuck
    assert reward_runner.stats["timeout"] >= 1
    assert stats["rollout/dropped_groups/failed"] >= 1
    assert stats["staleness/max"] <= 1


@pytest.mark.parametrize("mode", ["in_place", "abort"])
def test_pause_resume_across_weight_update_stamps_token_versions(server, models, tokenizer, at_version_0, mode):
    """Generations in flight across an update (kept in place, or aborted and resumed by the client)
    finish with every token stamped with the version that produced it."""
    client = InferenceClient([server.address])
    n_tokens = 192
    sampling = {"max_new_tokens": n_tokens, "temperature": 1.0, "ignore_eos": True}

    class AdditionEnv(FlakyAdditionEnv):
        fault_rate = 0.0

        async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            await asyncio.sleep(random.Random(seed).random() * 0.3)  # staggered starts: some always mid-way
            return await super().areset(seed=seed, options=options)

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return "", float(len(action) % 2), True, False, {}

    cfg = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=8, max_head_offpolicyness=2)
    with RolloutExecutor(cfg, episode_fn=episode_fn(tokenizer, client, sampling, AdditionEnv), rows=ROWS,
                         on_shutdown=[client.aclose]) as ex:
        first = ex.prepare_batch(timeout=120)
        assert all(set(gen_versions(tr)) == {0} for g in first for tr in g)
        deadline = time.monotonic() + 30
        while client.inflight[0] < 4 and time.monotonic() < deadline:  # requests at the server
            time.sleep(0.002)
        tokens = control.server_info(server.address)["batching"]["generated_tokens"]
        while (control.server_info(server.address)["batching"]["generated_tokens"] < tokens + 8
               and time.monotonic() < deadline):  # ... and decoding at version 0
            time.sleep(0.002)
        # the weight update as the trainer brackets it
        ex.pause()
        control.pause_generation(server.address, mode=mode)
        assert ex.counts()["running"] > 0  # generations in flight during the update
        control.update_weights_from_disk(server.address, str(models[1]), 1)
        control.continue_generation(server.address)
        ex.set_version(1)
        ex.resume()
        trajs = [tr for _ in range(3) for g in ex.prepare_batch(timeout=120) for tr in g]
    mixed = 0
    for tr in trajs:
        assert tr.ok and tr.num_generated == n_tokens  # nothing lost to the interruption
        v = gen_versions(tr)
        assert v == sorted(v) and set(v) <= {0, 1}
        assert tr.start_version == 0 or set(v) == {1}
        mixed += set(v) == {0, 1}
    assert mixed >= 1, [(tr.group_id, tr.start_version, sorted(set(gen_versions(tr)))) for tr in trajs] + [client.stats]
    if mode == "abort":
        assert client.stats["resumes"] >= 1


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_clean_shutdown_with_requests_in_flight(server, tokenizer, at_version_0):
    threads0, fds0 = other_threads(), _open_fds()
    client = InferenceClient([server.address])
    sampling = {"max_new_tokens": 400, "temperature": 1.0, "ignore_eos": True}
    cfg = RolloutConfig(batch_size=2, group_size=2, max_concurrent_rollouts=8, max_head_offpolicyness=1)

    class QuietEnv(FlakyAdditionEnv):
        fault_rate = 0.0

    ex = RolloutExecutor(cfg, episode_fn=episode_fn(tokenizer, client, sampling, QuietEnv), rows=ROWS,
                         on_shutdown=[client.aclose])
    ex.start()
    deadline = time.monotonic() + 30
    while client.stats["requests"] < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ex.counts()["running"] == 8
    ex.shutdown()
    c = ex.counts()  # 8 aborted, none finished: the shutdown did not wait for the 400-token generations
    assert c["in_flight"] == 0 and c["failed"] == 8 and c["submitted"] == 8
    assert ex.stats()["rollout/failed/aborted"] == 8
    assert threads_drained(threads0)
    assert _open_fds() == fds0  # the client's sockets are closed
    # the server is still healthy and serving after the cancelled requests
    control.wait_healthy(server.address, timeout=10)


def test_rollout_only_mode_writes_decodable_jsonl(server, tokenizer, tmp_path, at_version_0):
    client = InferenceClient([server.address])
    sampling = {"max_new_tokens": 6, "temperature": 1.0}

    class QuietEnv(FlakyAdditionEnv):
        fault_rate = 0.0

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return "", 1.0, True, False, {}

    cfg = RolloutConfig(batch_size=1, group_size=2, max_concurrent_rollouts=8, max_head_offpolicyness=0)
    out = tmp_path / "rollouts.jsonl"
    with RolloutExecutor(cfg, episode_fn=episode_fn(tokenizer, client, sampling, QuietEnv), rows=ROWS,
                         on_shutdown=[client.aclose]) as ex:
        summary = write_rollouts(ex, 7, out, progress=False)
    trajs = [Trajectory.from_json(line) for line in out.read_text().splitlines()]
    assert summary["episodes"] == len(trajs) == 8
    for tr in trajs:
        tr.validate()
        assert tr.ok and tr.reward == 1.0 and 0 < tr.num_generated <= 6
        prompt = tokenizer.decode(tr.input_ids[: tr.turn_spans[0][0]])
        assert "What is" in prompt
