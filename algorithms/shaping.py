"""Reward shaping shared by every advantage estimator.

Order, per episode reward ``R`` (and elementwise on turn returns ``G_t`` for turn credit):

``r = clip((R + reward_bias) * reward_scaling  [0 if no EOS and mask_no_eos_with_zero]
+ overlong_penalty, -reward_clip, reward_clip)``

then optional return batch normalisation (ReBN), and, with ``kl_in_reward``, a per-token
penalty ``-kl_ctl * kl_t`` kept apart so each estimator can place it (reward-to-go).
Group statistics and whitening run in float64 so that equal rewards give exactly zero
advantage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from algorithms.functional import (
    get_mask,
    kl_estimate,
    require,
    safe_denominator,
    seq_tensor,
    token_tensor,
    turn_starts,
)
from areal_agents.config import AlgorithmConfig

__all__ = ["ShapedRewards", "kl_penalty", "overlong_penalty", "rebn", "shape_rewards"]


class ShapedRewards(NamedTuple):
    """Shaped returns of a batch, all float64.

    ``episode`` ``[B]``: shaped episode return per sequence.
    ``turn`` ``[B, T]`` or None: shaped per-token turn return ``G_t`` (credit == "turn"),
    0 outside ``loss_mask``.
    ``kl`` ``[B, T]``: per-token reward ``-kl_ctl * kl_t`` when ``kl_in_reward``, else 0.
    """

    episode: Tensor
    turn: Tensor | None
    kl: Tensor


def overlong_penalty(lengths: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """DAPO soft overlong penalty per sequence, in ``[-factor, 0]``.

    With cap ``L = max_response_tokens`` and window ``W = min(overlong_tokens, L)``:
    ``factor * clamp((L - W - len) / W, -1, 0)`` (0 up to ``L - W`` tokens, -factor at ``L``).
    Args: ``lengths`` ``[B]``. Returns ``[B]`` float64 (zeros when the penalty is off).
    """
    out = torch.zeros(lengths.shape, dtype=torch.float64, device=lengths.device)
    if cfg.overlong_tokens is None:
        return out
    if cfg.max_response_tokens is None:
        raise ValueError(
            "algorithm.overlong_tokens needs algorithm.max_response_tokens (the length cap L_max); "
            "load the config with load_config() or set it"
        )
    cap = float(cfg.max_response_tokens)
    window = float(min(cfg.overlong_tokens, cfg.max_response_tokens))
    ratio = (cap - window - lengths.to(torch.float64)) / window
    return cfg.overlong_penalty_factor * ratio.clamp(-1.0, 0.0)


def _shape(values: Tensor, no_eos: Tensor | None, penalty: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """Bias, scale, no-EOS zeroing, overlong penalty and clip; ``values`` ``[B]`` or ``[B, T]``."""
    extra = (lambda v: v[:, None]) if values.dim() == 2 else (lambda v: v)
    out = (values + cfg.reward_bias) * cfg.reward_scaling
    if no_eos is not None:
        out = torch.where(extra(no_eos), torch.zeros_like(out), out)
    out = out + extra(penalty)
    return out.clamp(-cfg.reward_clip, cfg.reward_clip)


def kl_penalty(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """Per-token KL reward ``-kl_ctl * kl(pi_old || ref)`` ``[B, T]`` float64, 0 when unused.

    The policy side is ``prox_logp`` when present, else the behaviour ``logprobs``.
    """
    mask = get_mask(batch)
    zeros = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    if not cfg.kl_in_reward or cfg.kl_ctl <= 0:
        return zeros
    needed = "algorithm.kl_in_reward with kl_ctl > 0"
    ref = token_tensor(require(batch, "ref_logp", needed), "batch['ref_logp']", mask).double()
    key = "prox_logp" if "prox_logp" in batch else "logprobs"
    pol = token_tensor(require(batch, key, needed), f"batch[{key!r}]", mask).double()
    kl = kl_estimate(pol, ref, cfg.kl_estimator)
    return torch.where(mask, -cfg.kl_ctl * kl, zeros)


def rebn(shaped: ShapedRewards, mask: Tensor, eps: float) -> ShapedRewards:
    """Return batch normalisation: standardise returns over the whole batch.

    Episode returns are standardised over the ``B`` sequences; turn returns over the turns
    of the batch, each turn counted once, and applied to all of its tokens. ``kl`` is kept.
    """
    ep = shaped.episode
    episode = (ep - ep.mean()) / safe_denominator(ep.std(correction=0) + eps)  # population std
    turn = shaped.turn
    if turn is not None:
        units = turn[turn_starts(mask, turn)]
        if units.numel() > 0:
            std = units.std(correction=0)
            turn = torch.where(mask, (turn - units.mean()) / safe_denominator(std + eps), torch.zeros_like(turn))
    return ShapedRewards(episode, turn, shaped.kl)


def shape_rewards(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> ShapedRewards:
    """Shape ``batch["rewards"]`` ``[B]`` (and ``turn_returns`` ``[B, T]`` for turn credit).

    Reads ``reward_bias``, ``reward_scaling``, ``reward_clip``, ``mask_no_eos_with_zero``
    (``no_eos`` ``[B]``), ``overlong_tokens``/``overlong_penalty_factor``/``max_response_tokens``
    (``response_lengths`` ``[B]``, default: masked tokens per row), ``kl_in_reward``/
    ``kl_ctl``/``kl_estimator`` (``ref_logp``), ``rebn`` and ``adv_eps``.
    """
    mask = get_mask(batch)
    bsz = mask.shape[0]
    rewards = seq_tensor(require(batch, "rewards", "every advantage estimator"), "batch['rewards']", bsz).double()
    no_eos = None
    if cfg.mask_no_eos_with_zero:
        no_eos = require(batch, "no_eos", "algorithm.mask_no_eos_with_zero").to(torch.bool)
        if no_eos.shape != (bsz,):
            raise ValueError(f"batch['no_eos'] must have shape ({bsz},), got {tuple(no_eos.shape)}")
    lengths = (seq_tensor(batch["response_lengths"], "batch['response_lengths']", bsz) if "response_lengths" in batch
               else mask.sum(-1))
    penalty = overlong_penalty(lengths, cfg)
    episode = _shape(rewards, no_eos, penalty, cfg)
    turn = None
    if cfg.credit == "turn":
        raw = require(batch, "turn_returns", "algorithm.credit='turn'")
        turn_raw = token_tensor(raw, "batch['turn_returns']", mask).double()
        turn = torch.where(mask, _shape(turn_raw, no_eos, penalty, cfg), torch.zeros_like(turn_raw))
    shaped = ShapedRewards(episode, turn, kl_penalty(batch, cfg))
    return rebn(shaped, mask, cfg.adv_eps) if cfg.rebn else shaped
