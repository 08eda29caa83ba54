"""RolloutExecutor: batches and groups, staleness bound, pausing, checkpoint state, shutdown.

The episodes here are timed coroutines (``timed_episode``) so scheduling can be tested
without a model; the tests against a real inference server are in test_rollout_server.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time

import pytest
from rollout_support import other_threads, threads_drained

from areal_agents.config import RolloutConfig
from areal_agents.rollout import RolloutExecutor
from areal_agents.types import Trajectory
from trainers.rollout_only import write_rollouts

ROWS = [{"question": f"{i}+{i}", "answer": str(2 * i)} for i in range(12)]



def make_traj(seed: int, reward: float, n_gen: int = 3) -> Trajectory:
    """A well-formed single-turn trajectory: 2 prompt tokens, ``n_gen`` generated."""
    t = Trajectory(input_ids=[1, 2] + [seed % 97 + 3] * n_gen, loss_mask=[0, 0] + [1] * n_gen,
                   logprobs=[0.0, 0.0] + [-0.5] * n_gen, versions=[-1, -1] + [0] * n_gen,
                   turn_spans=[(2, 2 + n_gen)])
    t.set_rewards([reward])  # the executor settles the return
    return t


def timed_episode(median_s: float = 0.004, sigma: float = 1.0, log: list | None = None):
    """episode_fn sleeping a lognormal time; reward = seed parity. Records (row, seed, id)."""

    async def episode(row: dict, seed: int, episode_id: str) -> Trajectory:
        if log is not None:
            log.append((row["question"], seed, episode_id))
        await asyncio.sleep(median_s * random.lognormvariate(0.0, sigma))
        t = make_traj(seed, float(seed % 2))
        t.info["question"] = row["question"]
        return t

    return episode


def cfg(**kw) -> RolloutConfig:
    base = dict(batch_size=3, group_size=4, max_concurrent_rollouts=64, max_head_offpolicyness=1,
                episode_timeout=30.0)
    base.update(kw)
    return RolloutConfig(**base)


def assert_invariant(c: dict) -> None:
    assert c["submitted"] == c["accepted"] + c["failed"] + c["dropped"] + c["in_flight"], c


def test_batches_are_groups_of_one_row_with_distinct_seeds():
    log: list = []
    with RolloutExecutor(cfg(), episode_fn=timed_episode(log=log), rows=ROWS, seed=7) as ex:
        batch = ex.prepare_batch(timeout=20)
        assert len(batch) == 3
        ids = set()
        for group in batch:
            assert len(group) == 4
            assert len({t.info["question"] for t in group}) == 1
            assert len({t.info["seed"] for t in group}) == 4
            assert len({t.group_id for t in group}) == 1
            ids.add(group[0].group_id)
            assert all(t.start_version == 0 and t.ok for t in group)
        assert len(ids) == 3
        stats = ex.stats()
    for key in ("rollout/reward", "rollout/reward_std", "rollout/episode_len", "rollout/turns", "rollout/tokens",
                "staleness/mean", "staleness/max", "perf/episodes_per_s", "perf/gen_tokens_per_s",
                "rollout/submitted", "rollout/accepted", "rollout/failed", "rollout/running",
                "rollout/dropped_groups"):
        assert key in stats, key
    trajs = [t for g in batch for t in g]
    assert stats["rollout/episode_len"] == 5.0 and stats["rollout/tokens"] == 3.0 and stats["rollout/turns"] == 1.0
    assert stats["rollout/reward"] == pytest.approx(sum(t.reward for t in trajs) / 12)
    assert stats["perf/episodes_per_s"] > 0
    # every episode id reached the episode function once
    assert len({e for _, _, e in log}) == len(log)


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_staleness_bound_holds_for_every_batch(eta):
    """No trajectory in a batch taken at version t started before t - eta; eta=0 is synchronous."""
    c = cfg(max_head_offpolicyness=eta, batch_size=2, group_size=3)
    B = c.batch_size * c.group_size
    seen_staleness = []
    with RolloutExecutor(c, episode_fn=timed_episode(0.003, 1.2), rows=ROWS, seed=1) as ex:
        for t in range(8):
            batch = ex.prepare_batch(timeout=30)
            for traj in (tr for g in batch for tr in g):
                assert traj.start_version >= t - eta, (t, traj.start_version)
                assert traj.start_version <= t
                seen_staleness.append(t - traj.start_version)
            assert ex.stats()["staleness/max"] == max(t - tr.start_version for g in batch for tr in g)
            counts = ex.counts()
            # capacity: never more than (eta + t + 1) * B episodes started and not dropped by version t
            assert counts["accepted"] + counts["in_flight"] <= (eta + t + 1) * B
            if eta == 0:
                assert counts["submitted"] == (t + 1) * B and counts["in_flight"] == 0
            deadline = time.monotonic() + 30  # "training": the pipeline runs ahead meanwhile (eta > 0)
            while eta and ex.counts()["running"] == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            ex.pause()
            ex.set_version(t + 1)
            ex.resume()
    if eta == 0:
        assert set(seen_staleness) == {0}
    else:  # the pipeline really overlapped generation with training
        assert max(seen_staleness) >= 1


def test_straggler_group_is_cancelled_as_stale():
    cancelled = []

    async def episode(row, seed, episode_id):
        if row["question"] == "0+0":  # this row's episodes would run forever
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(episode_id)
                raise
        await asyncio.sleep(0)
        return make_traj(seed, float(seed % 2))

    c = cfg(max_head_offpolicyness=1, batch_size=2, group_size=2)
    with RolloutExecutor(c, episode_fn=episode, rows=ROWS, shuffle=False) as ex:
        for t in range(4):
            batch = ex.prepare_batch(timeout=20)
            assert all(tr.info["seed"] is not None and tr.start_version >= t - 1 for g in batch for tr in g)
            ex.set_version(t + 1)
        deadline = time.monotonic() + 5
        while ex.stats().get("rollout/dropped_groups/stale", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats, counts = ex.stats(), ex.counts()
    assert stats["rollout/dropped_groups/stale"] >= 1
    assert len(cancelled) >= 2 and all(e.startswith("rollout-0-") for e in cancelled[:2])
    # the stale group's 2 episodes, cancelled for staleness, are dropped, not failed (episodes of a later
    # straggler group may be cancelled too, at staleness or at shutdown: counted when their group ends)
    assert counts["failed"] == 0 and counts["dropped"] >= 2
    assert_invariant(counts)


def _loop_turn(ex: RolloutExecutor) -> None:
    """Returns once the executor's event loop has run every callback queued before this call."""
    ex.run_coroutine(asyncio.sleep(0), timeout=30)


def test_pause_stops_launching_and_resume_continues():
    c = cfg(max_head_offpolicyness=2)
    with RolloutExecutor(c, episode_fn=timed_episode(0.002), rows=ROWS) as ex:
        ex.prepare_batch(timeout=20)
        ex.pause()
        deadline = time.monotonic() + 30
        while ex.counts()["running"] and time.monotonic() < deadline:  # the episodes in flight end
            time.sleep(0.005)
        before = ex.counts()
        ex.set_version(1)  # more capacity, but paused
        _loop_turn(ex)  # the launch the version bump asked for has run
        after = ex.counts()
        assert after["submitted"] == before["submitted"] and after["running"] == 0
        ex.resume()
        deadline = time.monotonic() + 10
        while ex.counts()["submitted"] == before["submitted"] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert ex.counts()["submitted"] == before["submitted"] + c.batch_size * c.group_size


def test_group_filter_drops_all_equal_groups_and_counts_them():
    async def episode(row, seed, episode_id):
        await asyncio.sleep(0)
        even_row = int(row["answer"]) % 4 == 0  # all-equal rewards for these rows
        return make_traj(seed, 1.0 if even_row else float(seed % 2))

    c = cfg(group_filter="nonzero_std", batch_size=4, group_size=2)
    with RolloutExecutor(c, episode_fn=episode, rows=ROWS, shuffle=False) as ex:
        batch = ex.prepare_batch(timeout=20)
        stats, counts = ex.stats(), ex.counts()
    for g in batch:
        assert len({t.reward for t in g}) == 2
    assert stats["rollout/dropped_groups"] >= 2 and stats["rollout/dropped_groups/filter"] >= 2
    assert counts["dropped"] == 2 * stats["rollout/dropped_groups"]
    assert_invariant(counts)


def test_rows_every_sample_solved_are_skipped_later_and_the_skips_are_counted():
    """skip_no_signal: once every sample of a row's group solved it, the row is mostly passed
    over later; a row no sample solved keeps coming (the filter drops its groups too)."""
    launched: list[str] = []

    def kind(answer: str) -> int:  # 0: every sample solves the row, 1: none does, 2: some do
        return int(answer) // 2 % 3

    async def episode(row, seed, episode_id):
        launched.append(row["answer"])
        await asyncio.sleep(0)
        return make_traj(seed, {0: 1.0, 1: 0.0}.get(kind(row["answer"]), float(seed % 2)))

    runs = {}
    for skip in (0.0, 0.9):
        launched.clear()
        c = cfg(group_filter="nonzero_std", batch_size=4, group_size=2, skip_no_signal=skip)
        with RolloutExecutor(c, episode_fn=episode, rows=ROWS, shuffle=False) as ex:
            for step in range(30):
                ex.prepare_batch(timeout=20)
                ex.set_version(step + 1)
            stats = ex.stats()
        share = [sum(kind(a) == k for a in launched) / len(launched) for k in (0, 1)]
        runs[skip] = (*share, stats["rollout/skipped_rows"])
    assert runs[0.0][2] == 0 and all(0.28 < x < 0.39 for x in runs[0.0][:2]), runs  # a third of the rows each
    assert runs[0.9][2] > 50 and runs[0.9][0] < 0.12 and runs[0.9][1] > 0.4, runs  # solved ones passed over


def test_skip_no_signal_needs_a_group_filter():
    with pytest.raises(ValueError, match=r"^skip_no_signal: needs a rollout.group_filter"):
        cfg(skip_no_signal=0.5)
    with pytest.raises(ValueError, match=r"^skip_no_signal: must be in \[0, 1\) \(got 1.0\)"):
        cfg(group_filter="nonzero_std", skip_no_signal=1.0)


def test_group_filter_gives_way_when_no_group_can_pass():
    """A policy that never succeeds must not starve the trainer: after 4 x batch_size groups
    in a row fail the filter, groups are kept (the batch then shows no signal)."""
    async def episode(row, seed, episode_id):
        await asyncio.sleep(0)
        return make_traj(seed, 0.0)

    c = cfg(group_filter="nonzero_std", batch_size=2, group_size=2)
    with RolloutExecutor(c, episode_fn=episode, rows=ROWS, shuffle=False) as ex:
        batch = ex.prepare_batch(timeout=20)
        stats = ex.stats()
    assert len(batch) == 2 and all(len({t.reward for t in g}) == 1 for g in batch)
    assert stats["rollout/dropped_groups/filter"] == 4 * c.batch_size
    assert stats["rollout/signal_groups"] == 0.0


def test_state_dict_resumes_dataloader_and_reruns_unconsumed_groups():
    log1: list = []
    c = cfg(max_head_offpolicyness=2, batch_size=2, group_size=2)
    ex = RolloutExecutor(c, episode_fn=timed_episode(0.002, log=log1), rows=ROWS, seed=5)
    ex.start()
    consumed = [g[0].group_id for g in ex.prepare_batch(timeout=20)]
    ex.pause()
    _loop_turn(ex)  # every launched episode has started (and logged itself)
    state = json.loads(json.dumps(ex.state_dict()))  # must survive a JSON round trip
    ex.shutdown()
    assert state["consumed_groups"] == 2
    unconsumed_serials = [s for _, _, s in state["unconsumed"]]
    assert unconsumed_serials and not {f"rollout-{s}" for s in unconsumed_serials} & set(consumed)

    log2: list = []
    ex2 = RolloutExecutor(c, episode_fn=timed_episode(0.002, log=log2), rows=ROWS, seed=5)
    ex2.load_state_dict(state)
    ex2.set_version(1)
    with ex2:
        ex2.prepare_batch(timeout=20)
    # the unconsumed groups are re-run first, with the same rows, seeds and ids
    first = {(q, s, e) for q, s, e in log2[: 2 * len(unconsumed_serials)]}
    assert first <= set(log1)
    # then the dataloader continues where it stopped: the next new row is the one after the saved position
    ex3 = RolloutExecutor(c, episode_fn=timed_episode(), rows=ROWS, seed=5)
    ex3._feeder.load_state_dict(state["feeder"])
    _, row = ex3._feeder.next()
    new_questions = [q for q, _, e in log2 if int(e.split("-")[1]) >= state["serial"]]
    assert new_questions and new_questions[0] == row["question"]


def test_bad_state_and_bad_use_fail_with_one_line():
    ex = RolloutExecutor(cfg(), episode_fn=timed_episode(), rows=ROWS)
    with pytest.raises(ValueError, match="invalid rollout state"):
        ex.load_state_dict({"feeder": {"epoch": 0, "index": 0, "num_rows": 12}})
    with pytest.raises(ValueError, match="5 dataset rows, this run has 12"):
        ex.load_state_dict({"feeder": {"epoch": 0, "index": 0, "num_rows": 5}, "serial": 0,
                            "consumed_groups": 0, "unconsumed": []})
    with pytest.raises(RuntimeError, match="start"):
        ex.wait(1, timeout=0.1)
    with pytest.raises(ValueError, match="max_concurrent_rollouts"):
        RolloutExecutor(cfg(group_size=8, max_concurrent_rollouts=4), episode_fn=timed_episode())
    with pytest.raises(ValueError, match="group_size >= 2"):
        RolloutExecutor(cfg(group_size=1, group_filter="nonzero_std"), episode_fn=timed_episode())
    with pytest.raises(TypeError, match="rows\\[1\\]"):
        RolloutExecutor(cfg(), episode_fn=timed_episode(), rows=[{"a": 1}, "b"])


def test_wait_times_out_and_runs_out_of_rows():
    released = threading.Event()

    async def slow(row, seed, episode_id):
        while not released.is_set():  # runs until the test lets it end
            await asyncio.sleep(0.01)
        return make_traj(seed, 1.0)

    with RolloutExecutor(cfg(), episode_fn=slow) as ex:  # no rows: only submit()
        with pytest.raises(RuntimeError, match="no rows left"):
            ex.wait(1, timeout=5)
        gid = ex.submit(ROWS[0])
        with pytest.raises(TimeoutError, match="0 of 1"):
            ex.wait(1, timeout=0.05)
        released.set()
        (group,) = ex.wait(1, timeout=10)
        assert group[0].group_id == gid and len(group) == 4


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_shutdown_cancels_everything_and_leaks_nothing():
    threads0, fds0 = other_threads(), _open_fds()
    started, cancelled = [], []
    leftover_tasks = []

    async def episode(row, seed, episode_id):
        started.append(episode_id)
        try:
            await asyncio.to_thread(time.sleep, 0.001)  # uses the loop's default thread pool
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(episode_id)
            raise
        return make_traj(seed, 1.0)

    async def on_shutdown():
        leftover_tasks.append(len(asyncio.all_tasks()))

    ex = RolloutExecutor(cfg(max_concurrent_rollouts=16), episode_fn=episode, rows=ROWS, on_shutdown=[on_shutdown])
    ex.start()
    deadline = time.monotonic() + 10
    while len(started) < 16 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() > threads0
    ex.shutdown()
    ex.shutdown()  # idempotent
    counts = ex.counts()
    assert len(cancelled) == len(started) == 16
    assert leftover_tasks == [1]  # only the shutdown coroutine itself
    assert counts["in_flight"] == 0 and counts["failed"] == 16 and ex.stats()["rollout/failed/aborted"] == 16
    assert_invariant(counts)
    assert threads_drained(threads0)
    assert _open_fds() == fds0
    assert ex._thread is not None and ex._thread.loop.is_closed()
    with pytest.raises(RuntimeError, match="closed"):
        ex.prepare_batch(timeout=1)
    with pytest.raises(RuntimeError, match="shut down"):
        ex.submit(ROWS[0])


def test_write_rollouts_jsonl_round_trip(tmp_path):
    out = tmp_path / "sub" / "rollouts.jsonl"
    c = cfg(max_head_offpolicyness=0, batch_size=1, group_size=3)
    with RolloutExecutor(c, episode_fn=timed_episode(0.001), rows=ROWS) as ex:
        summary = write_rollouts(ex, 10, out, progress=True)
        assert ex.bounded_staleness  # restored
    lines = out.read_text().splitlines()
    assert summary["episodes"] == len(lines) == 12  # rounded up to whole groups of 3
    trajs = [Trajectory.from_json(line) for line in lines]
    for t in trajs:
        t.validate()
    assert len({t.group_id for t in trajs}) == 4
    # eta = 0 and version 0 would allow one batch (3 episodes) only: the bound was lifted
    assert all(t.start_version == 0 for t in trajs)


def test_random_schedule_keeps_invariant_and_bound():
    """Randomised schedules of versions, pauses and waits: the accounting never breaks."""
    rng = random.Random(3)
    for trial in range(3):
        eta = rng.choice([0, 1, 2])
        c = cfg(max_head_offpolicyness=eta, batch_size=rng.choice([1, 2]), group_size=rng.choice([1, 2, 3]),
                max_concurrent_rollouts=rng.choice([3, 8, 32]), failure_policy=rng.choice(["drop", "zero"]))

        faults = random.Random(trial)

        async def episode(row, seed, episode_id, faults=faults):
            await asyncio.sleep(faults.random() * 0.004)
            if faults.random() < 0.2:
                raise RuntimeError("fault injection: env crashed")
            return make_traj(seed, float(seed % 2))

        with RolloutExecutor(c, episode_fn=episode, rows=ROWS, seed=trial) as ex:
            for t in range(6):
                for group in ex.prepare_batch(timeout=20):
                    assert len(group) == c.group_size
                    assert all(tr.start_version >= t - eta for tr in group)
                    if c.failure_policy == "drop":
                        assert all(tr.ok for tr in group)
                assert_invariant(ex.counts())
                if rng.random() < 0.5:
                    ex.pause()
                    time.sleep(rng.random() * 0.01)
                ex.set_version(t + 1)
                ex.resume()
        assert_invariant(ex.counts())
        assert ex.counts()["in_flight"] == 0


def test_waiting_that_could_never_finish_raises_instead_of_hanging():
    c = cfg(max_head_offpolicyness=0, batch_size=1, group_size=2)
    with RolloutExecutor(c, episode_fn=timed_episode(0.001), rows=ROWS) as ex:
        ex.prepare_batch(timeout=20)
        with pytest.raises(RuntimeError, match="staleness bound reached at version 0"):
            ex.prepare_batch(timeout=20)  # eta = 0 and no set_version: nothing more may start
        ex.pause()
        ex.set_version(1)
        with pytest.raises(RuntimeError, match="paused"):
            ex.prepare_batch(timeout=20)
        ex.resume()
        assert len(ex.prepare_batch(timeout=20)) == 1
