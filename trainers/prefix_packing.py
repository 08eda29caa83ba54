"""Prefix packing: tokens that rows share from their start run through the model once.

A GRPO group is ``group_size`` samples of one prompt, and the samples of a multi-turn group
often play the same first turns too (the same opening guess, the same first tool call); every
chat row starts with the same template tokens. Padded row by row, the model runs each shared
prefix once per row. Packed, the rows of a micro-batch form a token trie, laid out depth-first
in a few sequences: each token appears once, attends to the tokens on its own path from the
root (an attention mask), and has the position id it has in its rows. The logits that predict
each row's tokens are gathered back into the row's ``[T]`` layout, so everything downstream
(logprobs, entropy, the loss) is unchanged, and so are the numbers (float round-off apart): a
shared token's hidden states are the same in every row that has it, and the gradient reaching
them is the sum the copies would receive.

Rows sorted lexicographically are the trie's depth-first order: each row adds the tokens after
its longest common prefix with the row before it. A packed sequence is cut where it would pass
``max_len`` tokens (the next one starts with a whole row), since attention grows with the
square of a sequence's length; :func:`pack_prefixes` tries a few lengths and keeps the cheapest
under the caller's cost model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Packed", "pack_prefixes", "packed_layout"]

Cost = Callable[[int, int], float]  # (sequences, length) -> relative compute of a [sequences, length] forward


@dataclass
class Packed:
    """Model inputs for ``N`` packed sequences of length ``L`` and the way back to the rows.

    ``input_ids``, ``position_ids`` [N,L] long; ``attention_mask`` [N,1,L,L] bool (True =
    may attend); ``gather`` [B,T] long: for row ``b``, the flat index into ``N*L`` of the
    position whose logits predict token ``t+1`` (positions past the row's end point at 0 and
    are masked by the caller).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    gather: torch.Tensor


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # stops at the shorter
        if x != y:
            return i
    return min(len(a), len(b))


def _trie_order(rows: list[list[int]]) -> tuple[list[int], list[int]]:
    """The rows' depth-first trie order (sorted), and each row's common prefix with the row before it there."""
    order = sorted(range(len(rows)), key=lambda b: rows[b])
    return order, [0] + [_common(rows[order[k - 1]], rows[order[k]]) for k in range(1, len(order))]


def _sequences(rows: list[list[int]], order: list[int], lcp: list[int], max_len: int) -> tuple[list[list[int]], list[int]]:
    """Rows (in ``order``) cut into packed sequences of at most ``max_len`` tokens (a row longer
    than that gets one of its own), and each sequence's token count."""
    seqs: list[list[int]] = []
    sizes: list[int] = []
    for k, b in enumerate(order):
        new = len(rows[b]) - lcp[k]
        if not seqs or sizes[-1] + new > max_len:
            seqs.append([b])
            sizes.append(len(rows[b]))
        else:
            seqs[-1].append(b)
            sizes[-1] += new
    return seqs, sizes


def packed_layout(rows: list[list[int]], max_len: int, trie: tuple[list[int], list[int]] | None = None
                  ) -> tuple[list[list[int]], list[list[int]], list[int], list[int]]:
    """``(sequences, paths, sizes, shared)``: row indices per packed sequence (in trie order), per
    row the packed position of each of its tokens within its sequence, each sequence's token
    count, and per row how many of its first tokens an earlier row of its sequence placed
    (``trie``: :func:`_trie_order` of ``rows``, when the caller has it)."""
    order, lcp = trie or _trie_order(rows)
    seqs, sizes = _sequences(rows, order, lcp, max_len)
    paths: list[list[int]] = [[] for _ in rows]
    shared_of = [0] * len(rows)
    k = 0  # the sequences are consecutive runs of ``order``
    for seq in seqs:
        prev: list[int] = []
        size = 0
        for i, b in enumerate(seq):
            shared = lcp[k] if i else 0
            k += 1
            new = len(rows[b]) - shared
            paths[b], shared_of[b] = prev[:shared] + list(range(size, size + new)), shared
            size += new
            prev = paths[b]
    return seqs, paths, sizes, shared_of


def pack_prefixes(input_ids: torch.Tensor, lens: Sequence[int], cost: Cost | None = None,
                  margin: float = 1.0) -> Packed | None:
    """Pack the rows of ``input_ids`` [B,T] (``lens`` real tokens each) so shared prefixes run once.

    ``cost(n, length)`` rates a forward pass over ``[n, length]`` (default: its token count);
    packed layouts are tried with sequences of at most 1, 2, 4, ... times the longest row (up to
    all rows in one) and the cheapest is kept. Returns None when no two rows share a first token
    or no layout costs less than ``margin`` times the padded rows. Padding (id 0) ends each packed sequence and attends only to the
    sequence's first token, so no real token attends to it and no softmax row is empty.
    """
    rows = [row[: int(n)] for row, n in zip(input_ids.tolist(), lens, strict=True)]
    longest = max((len(r) for r in rows), default=0)
    if longest == 0 or len({r[0] for r in rows if r}) == sum(1 for r in rows if r):
        return None
    cost = cost or (lambda n, length: float(n * length))
    best, best_cost = None, margin * cost(len(rows), int(input_ids.shape[1]))
    cap, trie = longest, _trie_order(rows)
    while True:
        sizes = _sequences(rows, *trie, cap)[1]
        n_seq, length = len(sizes), max(sizes)
        if cost(n_seq, length) < best_cost:
            best, best_cost = cap, cost(n_seq, length)
        if n_seq == 1:
            break
        cap *= 2
    if best is None:
        return None
    return _build(rows, input_ids.shape, *packed_layout(rows, best, trie))


def _build(rows: list[list[int]], shape: torch.Size, seqs: list[list[int]], paths: list[list[int]],
           sizes: list[int], shared: list[int]) -> Packed:
    """The layout's tensors, filled row by row in numpy (a few array writes a row; torch's
    per-call overhead on small index tensors cost more than the writes themselves)."""
    n_seq, length = len(seqs), max(sizes)
    ids = np.zeros((n_seq, length), dtype=np.int64)
    pos = np.zeros((n_seq, length), dtype=np.int64)
    mask = np.zeros((n_seq, length, length), dtype=np.bool_)
    for s, size in enumerate(sizes):
        mask[s, size:, 0] = True  # padding attends to the sequence's first token
    gather = np.zeros(tuple(shape), dtype=np.int64)
    tril = np.tri(length, dtype=np.bool_)
    for s, seq in enumerate(seqs):
        for b in seq:
            path, n = paths[b], len(rows[b])
            if not n:
                continue
            at, k = np.asarray(path, dtype=np.int64), shared[b]
            new = at[k:]
            ids[s, new] = rows[b][k:]
            pos[s, new] = np.arange(k, n)
            mask[s, new[:, None], at[None, :]] = tril[k:n, :n]  # a placed token's row was written by its placer
            gather[b, :n] = at + s * length
    return Packed(torch.from_numpy(ids), torch.from_numpy(pos), torch.from_numpy(mask)[:, None], torch.from_numpy(gather))
