"""Batching: padded tensors, micro-batch budgets, rank splits, rollout JSONL loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trainer_helpers import make_trajs

from areal_agents.types import Trajectory
from trainers.batching import collate, concat_batches, load_trajectories, micro_batch_indices, rank_indices, select


def test_collate_fields() -> None:
    t = Trajectory(input_ids=[5, 6, 7, 8, 9, 10], loss_mask=[0, 1, 1, 0, 1, 1], logprobs=[0, -0.1, -0.2, 0, -0.3, -0.4],
                   versions=[-1, 3, 3, -1, 4, 4], turn_spans=[(1, 3), (4, 6)], group_id="a", finish_reason="length")
    t.set_rewards([1.0, 2.0], 0.5)  # returns G = [2.0, 2.0]
    u = Trajectory(input_ids=[1, 2, 3], loss_mask=[0, 0, 1], logprobs=[0, 0, -1.0], versions=[-1, -1, 0],
                   turn_spans=[(2, 3)], group_id="b", reward=0.5, turn_returns=[0.5])
    b = collate([t, u], pad_token_id=99)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10], [1, 2, 3, 99, 99, 99]]
    assert b["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert b["loss_mask"].dtype == torch.bool and b["loss_mask"][1].tolist() == [False, False, True, False, False, False]
    assert b["versions"].tolist() == [[-1, 3, 3, -1, 4, 4], [-1, -1, 0, -1, -1, -1]]
    assert b["turn_returns"].tolist() == [[0, 2.0, 2.0, 0, 2.0, 2.0], [0, 0, 0.5, 0, 0, 0]]
    assert b["rewards"].tolist() == [2.0, 0.5]
    assert b["group_ids"].tolist() == [0, 1] and b["no_eos"].tolist() == [True, False]
    assert b["response_lengths"].tolist() == [4, 1] and b["seq_lens"].tolist() == [6, 3]
    s = select(b, [1])
    assert s["input_ids"].shape == (1, 3) and s["rewards"].tolist() == [0.5]
    assert torch.equal(concat_batches([select(b, [0]), s], pad_token_id=99)["input_ids"], b["input_ids"])


def test_collate_rejects_bad_trajectories() -> None:
    bad = Trajectory(input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0], versions=[-1, 0])
    with pytest.raises(ValueError, match="trajectory 0: trajectory.logprobs has 1 entries"):
        collate([bad])
    with pytest.raises(ValueError, match="needs a prompt token"):
        collate([Trajectory(input_ids=[1, 2], loss_mask=[1, 1], logprobs=[0, 0], versions=[0, 0])])
    with pytest.raises(ValueError, match="empty"):
        collate([])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), st.integers(1, 2000), st.integers(1, 6))
def test_micro_batches_respect_the_budget(lens: list[int], budget: int, min_count: int) -> None:
    mbs = micro_batch_indices(lens, budget, min_count=min_count)
    flat = sorted(i for mb in mbs for i in mb)
    assert flat == list(range(len(lens)))  # every row exactly once
    assert len(mbs) >= min_count
    for mb in mbs:
        if len(mb) > 1:
            assert len(mb) * max(lens[i] for i in mb) <= budget


@given(st.lists(st.integers(1, 300), min_size=0, max_size=40), st.integers(1, 5))
def test_rank_split_is_a_partition(lens: list[int], world: int) -> None:
    parts = [rank_indices(lens, world, r) for r in range(world)]
    assert sorted(i for p in parts for i in p) == list(range(len(lens)))
    loads = [sum(lens[i] for i in p) for p in parts]
    if lens:
        assert max(loads) - min(loads) <= max(lens)  # greedy longest-first balance


def test_load_trajectories(tmp_path: Path) -> None:
    trajs = make_trajs(3)
    good = tmp_path / "r.jsonl"
    good.write_text("\n".join(t.to_json() for t in trajs) + "\n\n")
    loaded = load_trajectories(good)
    assert [t.input_ids for t in loaded] == [t.input_ids for t in trajs]
    assert loaded[0].turn_spans == trajs[0].turn_spans
    bad = tmp_path / "bad.jsonl"
    bad.write_text(trajs[0].to_json() + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: "):
        load_trajectories(bad)
    d = trajs[0].to_dict()
    d["loss_mask"] = d["loss_mask"][:-1]
    bad.write_text(json.dumps(d) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: trajectory.loss_mask has"):
        load_trajectories(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected a JSON object"):
        load_trajectories(bad)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no trajectories"):
        load_trajectories(tmp_path / "empty.jsonl")
