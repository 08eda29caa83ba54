"""Advantage estimators: ``fn(batch, cfg) -> advantages [B, T]``, zero outside ``loss_mask``.

Each estimator shapes the rewards itself (:func:`shape_rewards`) and is called once on the
whole batch before it is split into micro-batches. Returns are counted in *units*: one per
episode for ``credit="trajectory"``, one per turn (a maximal run of generated tokens) for
``credit="turn"``. The score of a token is its unit's shaped return plus, with
``kl_in_reward``, the KL penalty still to come in its sequence (reward-to-go). GiGPO adds to
GRPO's advantage a step-level one computed over *step groups*: the turns of a group that act
in the same env state (``batch["state_ids"]``).

Statistics run in float64; the result has the dtype of ``batch["rewards"]`` promoted to at
least float32. Estimators read the batch and never write to it: PPO's critic targets are a
function of their own (:func:`gae_returns`), which the recipe stores as ``batch["returns"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch import Tensor

from algorithms.functional import (
    discounted_to_go,
    get_mask,
    group_index,
    masked_whiten,
    require,
    safe_denominator,
    token_tensor,
    turn_starts,
)
from algorithms.shaping import ShapedRewards, shape_rewards
from areal_agents.config import AlgorithmConfig

__all__ = [
    "dr_grpo_advantages",
    "gae_advantages",
    "gae_returns",
    "gigpo_advantages",
    "grpo_advantages",
    "reinforce_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "shape_rewards",
    "step_advantages",
    "unit_scores",
]


def _out_dtype(batch: Mapping[str, Tensor]) -> torch.dtype:
    return torch.promote_types(batch["rewards"].dtype, torch.float32)


def unit_scores(shaped: ShapedRewards, mask: Tensor, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token scores and the per-unit values group baselines are computed from.

    Returns ``(scores [B, T], unit_values [U], unit_seq [U])``: ``scores`` is the unit return
    plus the undiscounted KL reward-to-go (0 outside ``mask``); ``unit_values`` the score at
    each unit's start; ``unit_seq`` the sequence each unit belongs to. For trajectory credit
    ``U = B`` (a sequence without generated tokens is still a unit with its reward).
    """
    kl_to_go = discounted_to_go(shaped.kl, mask, 1.0)
    zeros = torch.zeros_like(kl_to_go)
    if cfg.credit == "turn":
        assert shaped.turn is not None
        scores = torch.where(mask, shaped.turn + kl_to_go, zeros)
        rows, cols = turn_starts(mask, shaped.turn).nonzero(as_tuple=True)
        return scores, scores[rows, cols], rows
    scores = torch.where(mask, shaped.episode[:, None] + kl_to_go, zeros)
    values = shaped.episode + shaped.kl.sum(-1)
    return scores, values, torch.arange(mask.shape[0], device=mask.device)


def _group_stats(values: Tensor, groups: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group (sum, count, population std) of ``values`` ``[U]`` with ``groups`` ``[U]``."""
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, groups, values)
    counts = torch.zeros_like(sums).index_add_(0, groups, torch.ones_like(values))
    mean = sums / counts.clamp(min=1)
    dev = (values - mean[groups]) ** 2
    var = torch.zeros_like(sums).index_add_(0, groups, dev) / counts.clamp(min=1)
    return sums, counts, var.sqrt()


def grpo_advantages(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """GRPO: ``A = (s - mean_g) / (std_g + adv_eps)`` per group of the same prompt.

    ``mean_g``/``std_g`` (population std) are over the units of the group; without
    ``group_std_norm`` the division is skipped (Dr.GRPO). A group of one, or a group with
    equal rewards, gets zero advantage.
    Reads ``batch``: ``loss_mask`` ``[B, T]``, ``rewards`` ``[B]``, ``group_ids`` ``[B]``
    (+ shaping inputs). Returns ``[B, T]``.
    """
    mask = get_mask(batch)
    shaped = shape_rewards(batch, cfg)
    scores, values, unit_seq = unit_scores(shaped, mask, cfg)
    seq_group, num_groups = group_index(require(batch, "group_ids", "group-baseline estimators"))
    sums, counts, std = _group_stats(values, seq_group[unit_seq], num_groups)
    mean = (sums / counts.clamp(min=1))[seq_group]
    adv = scores - mean[:, None]
    if cfg.group_std_norm:
        adv = adv / safe_denominator(std[seq_group][:, None] + cfg.adv_eps)
    return torch.where(mask, adv, torch.zeros_like(adv)).to(_out_dtype(batch))


def dr_grpo_advantages(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """Dr.GRPO: ``A = s - mean_g`` (GRPO without the std division). Returns ``[B, T]``."""
    return grpo_advantages(batch, dataclasses.replace(cfg, group_std_norm=False))


def step_advantages(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """GiGPO's step-level advantage: ``A_step = (G_t - mean_s) / (std_s + adv_eps)``.

    ``G_t`` is the shaped turn return (``turn_returns``, discounted per turn with the env's
    ``turn_discount``; the KL reward is left to the episode part); ``s`` is the turn's step
    group, the turns with the same ``group_ids`` and ``state_ids``, each turn counted once;
    ``std_s`` the population std (skipped without ``group_std_norm``). A step group of one,
    or of equal returns, gets 0. Reads ``loss_mask`` ``[B, T]``, ``rewards`` ``[B]``,
    ``turn_returns`` ``[B, T]``, ``group_ids`` ``[B]``, ``state_ids`` ``[B, T]`` (int; only
    read inside ``loss_mask``). Returns ``[B, T]`` float64.
    """
    mask = get_mask(batch)
    turn = shape_rewards(batch, dataclasses.replace(cfg, credit="turn")).turn
    assert turn is not None
    states = require(batch, "state_ids", "gigpo (step groups)")
    if states.shape != mask.shape:
        raise ValueError(f"batch['state_ids'] must have the shape of loss_mask {tuple(mask.shape)}, "
                         f"got {tuple(states.shape)}")
    states = torch.where(mask, states.long(), torch.zeros((), dtype=torch.long, device=mask.device))
    seq_group, _ = group_index(require(batch, "group_ids", "group-baseline estimators"))
    rows, cols = mask.nonzero(as_tuple=True)  # every generated token, with its turn's return and step group
    _, step = torch.unique(torch.stack([seq_group[rows], states[rows, cols]]), dim=1, return_inverse=True)
    values = turn[rows, cols]
    first = (turn_starts(mask, turn) | turn_starts(mask, states))[rows, cols]  # one token per turn
    num_steps = int(step.max()) + 1 if step.numel() else 0
    sums, counts, std = _group_stats(values[first], step[first], num_steps)
    adv = values - (sums / counts.clamp(min=1))[step]
    if cfg.group_std_norm:
        adv = adv / safe_denominator(std[step] + cfg.adv_eps)
    return torch.zeros_like(turn).index_put((rows, cols), adv)


def gigpo_advantages(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """GiGPO (group-in-group): ``A = A_episode + step_adv_weight * A_step``.

    ``A_episode`` is :func:`grpo_advantages` (episode groups of the same prompt, units as
    ``credit`` says) and ``A_step`` is :func:`step_advantages` (each turn against the turns of
    its group from the same env state). ``step_adv_weight = 0`` gives GRPO exactly (and needs
    no ``state_ids``). Reads what both read. Returns ``[B, T]``.
    """
    episode = grpo_advantages(batch, cfg)
    if cfg.step_adv_weight == 0:
        return episode
    step = step_advantages(batch, cfg)
    return (episode.double() + cfg.step_adv_weight * step).to(episode.dtype)


def rloo_advantages(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """RLOO: ``A_i = s_i - mean of the other episodes' units in the group``.

    For trajectory credit this is ``n/(n-1) * (R_i - mean_g)``; a group of one gets 0.
    Reads ``loss_mask``, ``rewards`` ``[B]``, ``group_ids`` ``[B]``. Returns ``[B, T]``.
    """
    mask = get_mask(batch)
    shaped = shape_rewards(batch, cfg)
    scores, values, unit_seq = unit_scores(shaped, mask, cfg)
    seq_group, num_groups = group_index(require(batch, "group_ids", "group-baseline estimators"))
    g_sums, g_counts, _ = _group_stats(values, seq_group[unit_seq], num_groups)
    e_sums, e_counts, _ = _group_stats(values, unit_seq, mask.shape[0])  # each episode's own units
    others = g_counts[seq_group] - e_counts
    baseline = (g_sums[seq_group] - e_sums) / others.clamp(min=1)
    adv = scores - baseline[:, None]
    keep = mask & (others > 0)[:, None]
    return torch.where(keep, adv, torch.zeros_like(adv)).to(_out_dtype(batch))


def _token_returns(shaped: ShapedRewards, mask: Tensor, cfg: AlgorithmConfig) -> Tensor:
    """Discounted (``token_discount``) token returns ``[B, T]`` of the episode reward and the KL reward.

    Trajectory credit places the episode reward on the last generated token; turn credit
    adds the turn return ``G_t`` (already discounted per turn) to the KL reward-to-go.
    """
    if cfg.credit == "turn":
        assert shaped.turn is not None
        return shaped.turn + discounted_to_go(shaped.kl, mask, cfg.token_discount)
    return discounted_to_go(_terminal_rewards(shaped, mask), mask, cfg.token_discount)


def _terminal_rewards(shaped: ShapedRewards, mask: Tensor) -> Tensor:
    """Token rewards ``[B, T]``: the KL reward plus the episode reward on the last masked token."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(-1).values
    is_last = positions == last[:, None]
    return shaped.kl + torch.where(is_last & mask, shaped.episode[:, None], torch.zeros_like(shaped.kl))


def reinforce_advantages(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """REINFORCE with turn-level returns: ``A_t = G_t`` (no baseline; pair with ``rebn``).

    ``G_t`` is the discounted token return of :func:`reinforce_pp_advantages`, unwhitened.
    Reads ``loss_mask``, ``rewards`` (``turn_returns`` for turn credit). Returns ``[B, T]``.
    """
    mask = get_mask(batch)
    returns = _token_returns(shape_rewards(batch, cfg), mask, cfg)
    return torch.where(mask, returns, torch.zeros_like(returns)).to(_out_dtype(batch))


def reinforce_pp_advantages(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """REINFORCE++: token returns ``G_t = sum_{s>=t} token_discount^(s-t) r_s`` whitened over the batch.

    ``r_s`` is ``-kl_ctl * kl_s`` on every generated token (with ``kl_in_reward``) plus the
    episode reward on the last one; ``A = (G - mean) / (std + adv_eps)`` over all generated
    tokens of the batch. Reads ``loss_mask``, ``rewards`` (+ ``ref_logp``). Returns ``[B, T]``.
    """
    mask = get_mask(batch)
    returns = _token_returns(shape_rewards(batch, cfg), mask, cfg)
    return masked_whiten(returns, mask, cfg.adv_eps).to(_out_dtype(batch))


def _gae(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> tuple[Tensor, Tensor, Tensor]:
    """GAE ``A`` ``[B, T]`` (float64, unwhitened), the values it used and the mask."""
    if cfg.credit == "turn":
        raise ValueError("gae_advantages: algorithm.credit='turn' is not supported; use credit=trajectory with ppo")
    mask = get_mask(batch)
    values = token_tensor(require(batch, "values", "ppo (GAE)"), "batch['values']", mask).double()
    rewards = _terminal_rewards(shape_rewards(batch, cfg), mask)
    adv = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(next_adv)
    for t in range(mask.shape[1] - 1, -1, -1):
        m = mask[:, t]
        delta = rewards[:, t] + cfg.token_discount * next_value - values[:, t]
        a = delta + cfg.token_discount * cfg.gae_lambda * next_adv
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
        next_adv = torch.where(m, a, next_adv)
        next_value = torch.where(m, values[:, t], next_value)
    return adv, values, mask


def gae_advantages(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """PPO with a critic: GAE over the generated tokens of each sequence, then whitened.

    ``delta_t = r_t + token_discount * V_next - V_t``; ``A_t = delta_t + token_discount * gae_lambda * A_next`` where
    ``next`` is the next generated token (``V = 0`` after the last). ``r_t`` is as in
    REINFORCE++. Reads ``loss_mask``, ``rewards``, ``values`` ``[B, T]`` (critic estimate for
    the state in which token t is generated). Returns whitened ``A`` ``[B, T]``; the critic's
    targets are :func:`gae_returns`.
    """
    adv, _, mask = _gae(batch, cfg)
    return masked_whiten(adv, mask, cfg.adv_eps).to(_out_dtype(batch))


def gae_returns(batch: Mapping[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """The critic's targets ``A + V`` ``[B, T]`` of :func:`gae_advantages` (before whitening; 0
    off the mask): what the PPO value loss reads as ``batch["returns"]``."""
    adv, values, mask = _gae(batch, cfg)
    return torch.where(mask, adv + values, torch.zeros_like(adv)).to(_out_dtype(batch))
