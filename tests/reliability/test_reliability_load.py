"""Load: the RolloutExecutor held at 256 concurrent math episodes (ChatAgent, real reward
workers) against two embedded servers for a fixed number of episodes. Memory must stay flat after a
warm-up (test process and servers), and shutdown must leave no asyncio task, socket or thread.
The phases are counted in episodes, not seconds, so a slow machine runs the same test.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path

import psutil
import pytest
from reliability_support import make_model, record, rss_mb, settled_thread_count, start_servers

from areal_agents.agent import ChatAgent
from areal_agents.config import RolloutConfig
from areal_agents.data import arithmetic_dataset
from areal_agents.gym.registration import make_env
from areal_agents.inference.client import InferenceClient
from areal_agents.llm import ClientLLM
from areal_agents.rewards import RewardRunner, math_reward, set_default_runner
from areal_agents.rollout import RolloutExecutor, make_episode_fn

CONCURRENCY = 256
WARMUP_EPISODES = 8 * CONCURRENCY
MEASURE_EPISODES = 16 * CONCURRENCY  # many episodes per slot: a leak grows with episodes
SAMPLE_EVERY = 128  # episodes between two memory samples (32 samples in the measured window)
RSS_TOLERANCE_MB = 40.0  # allowed growth after warm-up (allocator noise; a leak grows with episodes)
RSS_WINDOW = 10  # memory is compared as the median of this many samples at each end of the window:
# one reading of two servers swings by +-50 MB with the allocator (seen both ways: 896 -> 850 in a
# 200 s run, 850 -> 911 in a 60 s one), which no single pair of readings can tell from a leak


def server_rss(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        proc = psutil.Process(pid)
        total += sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20
    return total


def connections_to(ports: set[int]) -> int:
    return sum(1 for c in psutil.Process().net_connections(kind="inet") if c.raddr and c.raddr.port in ports)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_256_concurrent_episodes_hold_steady_and_leak_nothing(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model = make_model(tmp_path)
    tok = AutoTokenizer.from_pretrained(model)
    group = start_servers(model, 2, tmp_path / "logs", max_batch_size=128)
    ports = {int(a.rsplit(":", 1)[1]) for a in group.addresses}
    pids = [h.process.pid for h in group]
    runner = RewardRunner(timeout=10.0, max_workers=2)
    old_runner = set_default_runner(runner)
    # workers are started by one process-lifetime thread (their parent-death signal is tied to
    # it), made at the first reward: part of the baseline, not a leak
    # (a reply the fast path cannot decide, so a worker answers it: "5" == "5" would never start one)
    assert runner.compute(math_reward, "\\boxed{1/2}", {"answer": "0.5"}).value == 1.0
    threads0, conns0 = settled_thread_count(), connections_to(ports)
    client = InferenceClient(group.addresses, schedule="least_loaded")
    sampling = {"max_new_tokens": 8, "temperature": 1.0}
    agent = ChatAgent(max_turns=1, max_tokens=8, sampling=sampling)
    fn = make_episode_fn(lambda: make_env("math"), agent,
                         lambda rid: ClientLLM(tok, client, rid=rid, default_sampling=sampling), episode_timeout=120)
    cfg = RolloutConfig(batch_size=8, group_size=4, max_concurrent_rollouts=CONCURRENCY, episode_timeout=150,
                        failure_policy="zero")
    ex = RolloutExecutor(cfg, episode_fn=fn, rows=arithmetic_dataset("train", size=512), bounded_staleness=False,
                         on_shutdown=[client.aclose])
    running: list[int] = []
    consumed = 0
    try:
        ex.start()
        samples: list[tuple[float, float]] = []  # (test, servers) RSS in MB, every SAMPLE_EVERY episodes
        next_sample = WARMUP_EPISODES
        while consumed < WARMUP_EPISODES + MEASURE_EPISODES:
            consumed += sum(len(g) for g in ex.wait(1, timeout=120))
            running.append(ex.counts()["running"])
            if consumed >= next_sample:
                samples.append((rss_mb(), server_rss(pids)))
                next_sample += SAMPLE_EVERY
        measured = consumed - WARMUP_EPISODES
        ex.pause()  # drain, then look for leftover tasks on the executor's loop
        deadline = time.monotonic() + 120
        while ex.counts()["in_flight"] and time.monotonic() < deadline:
            if ex.counts()["ready_groups"]:
                consumed += sum(len(g) for g in ex.wait(ex.counts()["ready_groups"], timeout=30))
            time.sleep(0.01)

        async def other_tasks() -> int:
            return len(asyncio.all_tasks()) - 1

        leftover_tasks = ex.run_coroutine(other_tasks(), timeout=10)
        counts = ex.counts()
        ready = counts["ready_groups"]
        if ready:
            consumed += sum(len(g) for g in ex.wait(ready, timeout=30))
    finally:
        ex.shutdown()
        set_default_runner(old_runner)
        runner.close()
    deadline = time.monotonic() + 10
    while (threading.active_count() > threads0 or connections_to(ports)) and time.monotonic() < deadline:
        time.sleep(0.05)
    threads_after, conns_after = threading.active_count(), connections_to(ports)
    thread_names = sorted(t.name for t in threading.enumerate())
    servers_alive = all(h.alive for h in group)
    group.close()
    assert len(samples) >= 3 * RSS_WINDOW, len(samples)
    rss0, srv0 = (statistics.median(col) for col in zip(*samples[:RSS_WINDOW], strict=True))
    rss1, srv1 = (statistics.median(col) for col in zip(*samples[-RSS_WINDOW:], strict=True))
    steady = running[len(running) // 4:]
    assert leftover_tasks == 0
    assert threads_after == threads0 and conns_after == conns0 == 0, (threads0, thread_names, conns_after)
    assert servers_alive
    assert counts["in_flight"] == 0 and counts["submitted"] == counts["accepted"] + counts["failed"] + counts["dropped"]
    assert counts["failed"] == 0, ex.stats()
    assert max(running) == CONCURRENCY and statistics.median(steady) >= 0.75 * CONCURRENCY
    assert rss1 - rss0 <= RSS_TOLERANCE_MB, (rss0, rss1)
    assert srv1 - srv0 <= RSS_TOLERANCE_MB, (srv0, srv1)
    record("load_256_concurrent", concurrency=CONCURRENCY, servers=2, episodes_submitted=counts["submitted"],
           accepted=counts["accepted"], failed=counts["failed"], dropped=counts["dropped"],
           warmup_episodes=WARMUP_EPISODES, episodes_in_window=measured, median_running=statistics.median(steady),
           rss_test_mb_start=round(rss0, 1), rss_test_mb_end=round(rss1, 1), rss_servers_mb_start=round(srv0, 1),
           rss_servers_mb_end=round(srv1, 1), rss_tolerance_mb=RSS_TOLERANCE_MB, leaked_tasks=leftover_tasks,
           leaked_threads=threads_after - threads0, leaked_connections=conns_after)
