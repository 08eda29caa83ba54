"""Batching: padded tensors, micro-batch budgets, rank splits, rollout JSONL loading."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from trainer_helpers import make_trajs

from areal_agents.rollout.returns import settle_returns
from areal_agents.types import Trajectory
from trainers.batching import collate, concat_batches, load_trajectories, micro_batch_indices, rank_indices, select


def test_collate_fields() -> None:
    t = Trajectory(input_ids=[5, 6, 7, 8, 9, 10], loss_mask=[0, 1, 1, 0, 1, 1], logprobs=[0, -0.1, -0.2, 0, -0.3, -0.4],
                   versions=[-1, 3, 3, -1, 4, 4], turn_spans=[(1, 3), (4, 6)], group_id="a", finish_reason="length")
    t.set_rewards([1.0, 2.0])
    settle_returns(t, 0.5)  # returns G = [2.0, 2.0]
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


def test_state_ids_share_a_step_group_within_a_group_only() -> None:
    def traj(group: str, keys: list[str]) -> Trajectory:
        # prompt token, then per turn one generated token and one env token
        n = 1 + 2 * len(keys)
        return Trajectory(input_ids=[1] * n, loss_mask=[0] + [1, 0] * len(keys), logprobs=[0.0] * n,
                          versions=[-1] + [0, -1] * len(keys), turn_spans=[(1 + 2 * k, 2 + 2 * k) for k in
                                                                           range(len(keys))],
                          state_keys=keys, group_id=group)

    b = collate([traj("g", ["P", "X"]), traj("g", ["P", "X", "X"]), traj("h", ["P"]), traj("g", ["P", ""])])
    ids = b["state_ids"].tolist()
    p, x, hp = ids[0][1], ids[0][3], ids[2][1]
    assert ids[0] == [-1, p, -1, x, -1, -1, -1] and ids[1] == [-1, p, -1, x, -1, x, -1]  # padded with -1
    assert hp != p and len({p, x, hp}) == 3  # the same key in another group is another step group
    assert ids[3][1] == p and ids[3][3] not in (p, x, hp) and ids[3][3] >= 0  # "" (unknown): a group of its own
    # keys not aligned with the turns (as a file written before state keys existed): every turn on its own
    old = collate([traj("g", ["P", "X"]), replace(traj("g", ["P", "X"]), state_keys=[])])["state_ids"]
    assert old[1, 1] != old[0, 1] and old[1, 3] != old[0, 3] and old[1, 1] != old[1, 3]
    ends = concat_batches([select(b, [2]), select(b, [1])])["state_ids"]
    assert ends[0].tolist() == [-1, hp, -1, -1, -1, -1, -1]  # a shorter part is padded with -1


def test_recorded_keys_reach_the_step_advantage() -> None:
    """Two episodes of one prompt through the real ChatAgent: their retries share a state."""
    from algorithms.advantages import step_advantages
    from areal_agents import ChatAgent
    from areal_agents.config import AlgorithmConfig
    from areal_agents.llm.scripted import ScriptedLLM
    from envs.math_multiturn import MultiTurnMathEnv

    row = {"prompt": "1+1=", "answer": "2"}
    from areal_agents.rollout.returns import settle_returns

    agent = ChatAgent(max_turns=3)
    trajs = [settle_returns(asyncio.run(agent.run(MultiTurnMathEnv(max_turns=3), ScriptedLLM(replies), row)), 0.5)
             for replies in (["3", "2"], ["4", "5", "2"])]
    for t in trajs:
        t.group_id = "row0"
    assert [t.turn_returns for t in trajs] == [[0.5, 1.0], [0.25, 0.5, 1.0]]
    b = collate(trajs)
    starts = [[b["state_ids"][i, s].item() for s, _ in t.turn_spans] for i, t in enumerate(trajs)]
    assert starts[0][0] == starts[1][0] and starts[0][1] == starts[1][1] == starts[1][2] != starts[0][0]
    adv = step_advantages(b, AlgorithmConfig(use_decoupled_loss=False, group_std_norm=False))
    # first turns: .5 vs .25 -> +-.125; retries ("Wrong, try again."): 1, .5, 1 -> mean 5/6
    got = [[adv[i, s].item() for s, _ in t.turn_spans] for i, t in enumerate(trajs)]
    assert got == [pytest.approx([0.125, 1 / 6]), pytest.approx([-0.125, -1 / 3, 1 / 6])]


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


def _filled(lens: list[int], budget: int) -> list[list[int]]:
    """The plain split: length-sorted rows, each micro-batch filled up to the budget."""
    mbs: list[list[int]] = []
    for i in sorted(range(len(lens)), key=lambda j: (-lens[j], j)):
        if not mbs or (len(mbs[-1]) + 1) * lens[mbs[-1][0]] > budget:
            mbs.append([])
        mbs[-1].append(i)
    return mbs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 120), min_size=1, max_size=200), st.integers(64, 8192))
@example([38, 36, 36, 36], 99)  # runs chopped to the budget ([38] [36 36] [36]) cost more than filling ([38 36] [36 36])
def test_micro_batches_cost_no_more_than_filling_each_to_the_budget(lens: list[int], budget: int) -> None:
    """Padded tokens plus a micro-batch's own cost (budget / 32 tokens): never above the plain split's."""
    def cost(mbs: list[list[int]]) -> float:
        return sum(len(mb) * max(lens[i] for i in mb) + budget / 32 for mb in mbs if mb)

    mbs = micro_batch_indices(lens, budget)
    assert sorted(i for mb in mbs for i in mb) == list(range(len(lens)))
    assert cost(mbs) <= cost(_filled(lens, budget)) + 1e-9
    for mb in mbs:
        assert [lens[i] for i in mb] == sorted((lens[i] for i in mb), reverse=True)


def test_rows_of_mixed_lengths_are_cut_by_length() -> None:
    """64 rows of 30 to 84 tokens (graded groups of 1 to 4 answers) fit one 8,192-token micro-batch,
    where a third of it would be padding: cut between lengths, far less runs."""
    lens = [84] * 8 + [70] * 12 + [56] * 20 + [42] * 16 + [30] * 8
    mbs = micro_batch_indices(lens, 8192)
    padded = sum(len(mb) * max(lens[i] for i in mb) for mb in mbs)
    assert len(_filled(lens, 8192)) == 1 and 64 * 84 > 1.4 * sum(lens)
    assert 1 < len(mbs) <= 5 and padded < 1.1 * sum(lens), [[lens[i] for i in mb] for mb in mbs]
    assert micro_batch_indices([22] * 64, 8192) == [list(range(64))]  # one length: one micro-batch


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
