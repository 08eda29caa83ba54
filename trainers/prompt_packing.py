"""Shared-prompt packing: the samples of a group share their prompt, so a forward pass needs it once.

A GRPO group is ``group_size`` completions of one prompt. Padded row by row, the model runs
the prompt ``group_size`` times; packed, it runs it once. Rows whose tokens before their first
generated token are identical become one sequence ``prompt + suffix_1 + ... + suffix_k``,
where each suffix attends to the prompt and to itself (a block attention mask) and its
position ids continue from the prompt's, as if it followed the prompt alone. The logits that
predict each row's tokens are gathered back into the row's ``[T]`` layout, so everything
downstream (logprobs, entropy, the loss) is unchanged, and so are the numbers (float
round-off apart): the prompt's hidden states are the same in every copy, and the gradient
that reaches them is the sum the copies would receive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Packed", "pack_prompts"]


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


def _prompt_len(loss_mask: torch.Tensor, length: int) -> int:
    """Tokens before the first generated one (the whole row when none is generated)."""
    generated = loss_mask[:length].nonzero()
    return int(generated[0]) if len(generated) else length


def pack_prompts(input_ids: torch.Tensor, loss_mask: torch.Tensor, lens: Sequence[int]) -> Packed | None:
    """Pack rows of ``input_ids`` [B,T] (``lens`` real tokens each) that share their prompt.

    Padding (id 0) ends each packed sequence, so no real token attends to it; padding attends
    to the prompt, so no softmax row is empty. Returns None when no two rows share a prompt.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    prompt_lens = []
    for b, n in enumerate(lens):
        p = max(1, min(_prompt_len(loss_mask[b], n), n - 1))  # the last token is never a shared input
        prompt_lens.append(p)
        groups.setdefault(tuple(input_ids[b, :p].tolist()), []).append(b)
    if len(groups) == len(lens):
        return None
    seqs = list(groups.values())
    sizes = [prompt_lens[rows[0]] + sum(lens[b] - prompt_lens[b] for b in rows) for rows in seqs]
    n_seq, length = len(seqs), max(sizes)
    ids = torch.zeros((n_seq, length), dtype=torch.long)
    pos = torch.zeros((n_seq, length), dtype=torch.long)
    seg = torch.full((n_seq, length), -2, dtype=torch.long)  # -1 prompt, b row b's suffix, -2 padding
    gather = torch.zeros(input_ids.shape, dtype=torch.long)
    for s, rows in enumerate(seqs):
        p = prompt_lens[rows[0]]
        ids[s, :p], pos[s, :p], seg[s, :p] = input_ids[rows[0], :p], torch.arange(p), -1
        gather[rows, :p] = s * length + torch.arange(p)
        start = p
        for b in rows:
            k = lens[b] - p
            ids[s, start:start + k] = input_ids[b, p:lens[b]]
            pos[s, start:start + k] = torch.arange(p, lens[b])
            seg[s, start:start + k] = b
            # token p of row b is predicted at the prompt's last position; token p+j+1 at suffix position j
            gather[b, p:lens[b] - 1] = s * length + start + torch.arange(k - 1)
            start += k
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same = (seg[:, None, :] == -1) | (seg[:, None, :] == seg[:, :, None])
    return Packed(ids, pos, (causal & same)[:, None], gather)
