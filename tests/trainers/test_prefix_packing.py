"""The prefix-packed layout: every distinct prefix once, each token seeing exactly its own row's past."""

from __future__ import annotations

import random

import pytest
import torch

from trainers.prefix_packing import pack_prefixes, packed_layout


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    return ids, [len(r) for r in rows]


def _distinct_prefixes(rows: list[list[int]]) -> int:
    return len({tuple(r[: i + 1]) for r in rows for i in range(len(r))})


def _check(rows: list[list[int]], cap: int | None) -> None:
    """Every row reads back from the packed layout, sees exactly its own past, and padding sees
    only the sequence's first token."""
    ids, lens = _padded(rows)
    cost = None if cap is None else (lambda n, length: n * length * (1.0 if length <= cap else 1e9))
    packed = pack_prefixes(ids, lens, cost)
    assert packed is not None
    n_seq, length = packed.input_ids.shape
    flat_ids, flat_pos = packed.input_ids.reshape(-1), packed.position_ids.reshape(-1)
    mask = packed.attention_mask[:, 0]
    real = torch.zeros((n_seq, length), dtype=torch.bool)
    for b, row in enumerate(rows):
        at = packed.gather[b, : len(row)]
        assert flat_ids[at].tolist() == row and flat_pos[at].tolist() == list(range(len(row)))
        s = int(at[0]) // length
        assert all(int(a) // length == s for a in at)  # one row, one sequence
        local = (at % length).tolist()
        real[s, local] = True
        for t, q in enumerate(local):  # token t attends to the row's tokens 0..t and nothing else
            assert set(mask[s, q].nonzero().flatten().tolist()) == set(local[: t + 1])
    assert int(real.sum()) <= _distinct_prefixes(rows) + len(rows) * (n_seq - 1)
    if n_seq == 1:  # one sequence: each distinct prefix exactly once
        assert int(real.sum()) == _distinct_prefixes(rows)
    for s in range(n_seq):
        for q in (~real[s]).nonzero().flatten().tolist():  # padding
            assert mask[s, q].nonzero().flatten().tolist() == [0]
            assert int(packed.input_ids[s, q]) == 0
    if cap is not None:
        assert length <= max(cap, max(lens))


def test_a_small_trie() -> None:
    rows = [[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 7], [8, 9], [1, 2, 3, 4, 10], [1, 2, 3, 4]]
    ids, lens = _padded(rows)
    packed = pack_prefixes(ids, lens)
    assert packed is not None and packed.input_ids.shape == (1, 10)  # 1 2 3 4 10 5 6 7 8 9
    assert sorted(packed.input_ids[0].tolist()) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # the duplicate row and the row that another extends read the same positions
    torch.testing.assert_close(packed.gather[5, :4], packed.gather[0, :4])
    torch.testing.assert_close(packed.gather[4, :4], packed.gather[0, :4])
    _check(rows, None)


def test_nothing_shared_is_not_packed() -> None:
    ids, lens = _padded([[1, 2, 3], [2, 2, 3], [3, 1]])
    assert pack_prefixes(ids, lens) is None
    # sharing that costs more than the rows under the caller's model is not packed either
    ids, lens = _padded([[1, 2, 3, 4], [1, 5, 6, 7]])
    assert pack_prefixes(ids, lens, lambda n, length: n * length * (1 + length)) is None
    assert pack_prefixes(ids, lens) is not None


def test_sequences_are_cut_at_the_cap_and_each_cut_repeats_only_the_prefix() -> None:
    rows = [[1, 2, 3, k, k + 1] for k in range(10, 40, 3)]
    seqs, paths, sizes, _ = packed_layout(rows, 8)
    assert max(sizes) <= 8 and sum(len(s) for s in seqs) == len(rows)
    assert sizes == [5 + 2 * (len(s) - 1) for s in seqs]  # [1 2 3] once per sequence, then 2 tokens a row
    assert packed_layout(rows, 4)[2] == [5] * len(rows)  # a row longer than the cap gets its own sequence
    _check(rows, 10)  # the layouts tried are cut at 1, 2, 4, ... times the longest row


@pytest.mark.parametrize("seed", range(6))
def test_random_rows_read_back_exactly(seed: int) -> None:
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 5) for _ in range(rng.randint(1, 6))] for _ in range(3)]
    rows = [rng.choice(stems) + [rng.randrange(1, 4) for _ in range(rng.randint(0, 5))] for _ in range(12)]
    rows = [r for r in rows if r] + [stems[0]]
    _check(rows, None)
    _check(rows, 2 * max(map(len, rows)))
