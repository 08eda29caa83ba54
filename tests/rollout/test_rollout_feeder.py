"""The dataloader behind the executor: epochs are permutations; a saved position replays exactly."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_agents.rollout.groups import Ledger, RowFeeder, nonzero_std
from areal_agents.types import Trajectory


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 20), seed=st.integers(0, 10**6), shuffle=st.booleans(), k=st.integers(0, 70))
def test_epochs_are_permutations_and_positions_replay(n, seed, shuffle, k):
    rows = [{"i": i} for i in range(n)]
    feeder = RowFeeder(rows, seed=seed, shuffle=shuffle)
    seen = [feeder.next() for _ in range(k)]
    for epoch in range(k // n):  # every full epoch visits every row once
        assert sorted(r["i"] for key, r in seen if key[0] == epoch) == list(range(n))
    assert all(feeder.row_at(key) == row for key, row in seen)
    state = json.loads(json.dumps(feeder.state_dict()))
    resumed = RowFeeder(rows, seed=seed, shuffle=shuffle)
    resumed.load_state_dict(state)
    assert [resumed.next() for _ in range(n + 3)] == [feeder.next() for _ in range(n + 3)]


def test_shuffle_changes_order_between_epochs_and_seeds():
    rows = [{"i": i} for i in range(30)]
    order = lambda seed, epoch: [RowFeeder(rows, seed=seed, shuffle=True).row_at((epoch, j))["i"]  # noqa: E731
                                 for j in range(30)]
    assert order(1, 0) != order(1, 1) and order(1, 0) != order(2, 0) and order(1, 0) == order(1, 0)
    assert [RowFeeder(rows, seed=1, shuffle=False).row_at((3, j))["i"] for j in range(30)] == list(range(30))


def _traj(reward: float, status: str = "ok") -> Trajectory:
    t = Trajectory(status=status)
    t.reward = reward
    return t


@given(st.lists(st.tuples(st.lists(st.sampled_from(["ok", "ok", "env_error", "timeout"]), min_size=1, max_size=4),
                          st.sampled_from(["", "", "filter", "failed", "stale"])), max_size=30))
def test_ledger_partitions_every_episode(groups):
    ledger = Ledger()
    for statuses, reason in groups:
        ledger.submitted += len(statuses)
        ledger.resolve([_traj(0.0, s) for s in statuses], reason)
    assert ledger.submitted == ledger.accepted + ledger.failed + ledger.dropped
    assert ledger.failed == sum(ledger.failed_by_status.values())
    assert sum(ledger.dropped_groups.values()) == sum(1 for _, r in groups if r)


def test_nonzero_std_filter():
    assert not nonzero_std([_traj(1.0), _traj(1.0)])
    assert nonzero_std([_traj(1.0), _traj(0.0)])
    assert not nonzero_std([_traj(1e6), _traj(1e6 + 1e-6)])  # equal up to float noise
    assert not nonzero_std([])


def test_rows_without_signal_are_skipped_at_the_configured_rate_and_come_back():
    rows = [{"i": i} for i in range(200)]
    feeder = RowFeeder(rows, seed=3, shuffle=True, skip=0.75)
    marked = set(range(0, 200, 2))
    for epoch_index in range(200):  # the even rows' last groups gave no signal, the odd rows' did
        feeder.mark((0, epoch_index), feeder.row_at((0, epoch_index))["i"] not in marked)
    assert feeder.no_signal == marked
    fed = [feeder.next()[1]["i"] for _ in range(5000)]
    epochs = feeder.epoch
    assert all(fed.count(i) in (epochs, epochs + 1) for i in range(1, 200, 2))  # odd rows: never skipped
    fed_marked = sum(i in marked for i in fed)
    share = feeder.skipped / (feeder.skipped + fed_marked)  # of the even rows' turns, the share passed over
    assert 0.65 < share < 0.85, share
    assert {i for i in fed if i in marked} == marked  # every marked row still came back
    feeder.mark((feeder.epoch, 0), True)  # a group with signal unmarks its row
    assert feeder.row_at((feeder.epoch, 0))["i"] not in feeder.no_signal


def test_skipping_replays_from_a_saved_state_and_never_stalls():
    rows = [{"i": i} for i in range(7)]
    feeder = RowFeeder(rows, seed=5, shuffle=True, skip=0.99)
    for index in range(7):  # every row without signal
        feeder.mark((0, index), False)
    fed = [feeder.next() for _ in range(30)]  # each call still returns a row
    assert len(fed) == 30 and feeder.skipped > 30 * 5
    state = json.loads(json.dumps(feeder.state_dict()))
    resumed = RowFeeder(rows, seed=5, shuffle=True, skip=0.99)
    resumed.load_state_dict(state)
    assert resumed.no_signal == set(range(7)) and resumed.skipped == feeder.skipped
    assert [resumed.next() for _ in range(12)] == [feeder.next() for _ in range(12)]
    plain = RowFeeder(rows, seed=5, shuffle=True)  # skip 0: marks change nothing
    plain.load_state_dict(state)
    assert [plain.next()[0] for _ in range(7)] == [(state["epoch"], i) for i in range(state["index"], 7)] + [
        (state["epoch"] + 1, i) for i in range(state["index"])]
    assert plain.skipped == state["skipped"]


def test_a_feeder_without_rows_says_so():
    with pytest.raises(IndexError, match="no rows to feed"):
        RowFeeder([], seed=0, shuffle=True).next()
