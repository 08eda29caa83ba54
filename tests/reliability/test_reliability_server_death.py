"""Inference server death: two real embedded servers, one SIGKILLed while the RolloutExecutor
runs ChatAgent episodes over the InferenceClient; later restarted on the same port.

Checked: every episode finishes (none lost or counted twice: submitted == accepted + failed
+ dropped), the dead server leaves the client's rotation, and the restarted one is probed
and taken back (it serves tokens again).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_support import make_model, record, restart_server, start_servers

from areal_agents.agent import ChatAgent
from areal_agents.config import RolloutConfig
from areal_agents.env import Env
from areal_agents.inference import control
from areal_agents.inference.client import InferenceClient
from areal_agents.llm import ClientLLM
from areal_agents.rollout import RolloutExecutor, make_episode_fn
from areal_agents.types import Trajectory


class AdditionEnv(Env):
    """One-turn addition, scored in-process by exact match."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.row = dict(options or {})
        return f"What is {self.row['a']} + {self.row['b']}?", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        assert self.row is not None
        return "", float(action.strip() == str(self.row["a"] + self.row["b"])), True, False, {}


def generated_tokens(address: str) -> int:
    return int(control.server_info(address)["batching"]["generated_tokens"])


@pytest.mark.timeout(300)
def test_sigkill_one_server_mid_run_then_restart_it(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model = make_model(tmp_path)
    tok = AutoTokenizer.from_pretrained(model)
    group = start_servers(model, 2, tmp_path / "logs", max_batch_size=32)
    restarted = None
    client = InferenceClient(group.addresses, retries=4, backoff=0.05, reprobe_after=0.5)
    sampling = {"max_new_tokens": 24, "ignore_eos": True, "temperature": 1.0}
    agent = ChatAgent(max_turns=1, max_tokens=24, sampling=sampling)
    fn = make_episode_fn(AdditionEnv, agent, lambda rid: ClientLLM(tok, client, rid=rid, default_sampling=sampling),
                         episode_timeout=120)
    cfg = RolloutConfig(batch_size=1, group_size=2, max_concurrent_rollouts=16, failure_policy="zero",
                        episode_timeout=150)
    rows = [{"a": a, "b": b} for a in range(10) for b in range(10)]
    ex = RolloutExecutor(cfg, episode_fn=fn, rows=rows, bounded_staleness=False, on_shutdown=[client.aclose])
    done: list[Trajectory] = []

    def take(n: int = 1) -> None:
        done.extend(t for g in ex.wait(n, timeout=120) for t in g)

    try:
        ex.start()
        while len(done) < 16:
            take()
        deadline = time.monotonic() + 30
        while client.inflight[1] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        in_flight_on_victim = client.inflight[1]
        assert in_flight_on_victim > 0
        os.killpg(group[1].process.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        before_kill = len(done)
        take()
        first_after_kill = time.monotonic() - t_kill
        while len(done) < before_kill + 40:
            take()
        assert group[1].process.wait(10) == -signal.SIGKILL
        assert 1 in client.dead_until and client.stats["failovers"] >= 1  # out of rotation
        served_while_down = len(done) - before_kill

        restarted = restart_server(model, group[1].address, tmp_path / "logs" / "server-1-restarted.log",
                                   max_batch_size=32)
        t_up = time.monotonic()  # a fresh process: every token it reports was served after the restart
        back_after = None
        while time.monotonic() - t_up < 60:
            take()
            if generated_tokens(group[1].address) > 0:
                back_after = time.monotonic() - t_up
                break
        assert back_after is not None, "the restarted server was never taken back into rotation"
        ex.pause()  # drain: everything launched must finish and be counted
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            c = ex.counts()
            if c["ready_groups"]:
                take(c["ready_groups"])
            elif c["in_flight"] == 0:
                break
            else:
                time.sleep(0.01)
        counts, stats = ex.counts(), ex.stats()
    finally:
        ex.shutdown()
        group.close()
        if restarted is not None:
            os.killpg(restarted.pid, signal.SIGKILL)
            restarted.wait(10)
    assert counts["in_flight"] == 0
    assert counts["submitted"] == counts["accepted"] + counts["failed"] + counts["dropped"] == len(done)
    assert counts["failed"] == 0 and counts["dropped"] == 0, stats  # the victim's requests were resent
    assert len({t.info["episode_id"] for t in done}) == len(done)  # none counted twice
    assert all(t.ok and t.num_generated == 24 for t in done)
    record("inference_server_sigkill", episodes_submitted=counts["submitted"], accepted=counts["accepted"],
           failed=counts["failed"], dropped=counts["dropped"], requests_in_flight_on_victim=in_flight_on_victim,
           failovers=client.stats["failovers"], retries=client.stats["retries"],
           first_episode_after_kill_s=round(first_after_kill, 3), episodes_while_down=served_while_down,
           restart_to_back_in_rotation_s=round(back_after, 3))
