"""Rollout-trainer mismatch correction: behaviour importance weights, truncated or masked.

The inference server returns the logprobs of the tokens it sampled (``logprobs``, the
behaviour policy); the trainer recomputes them with its own weights and kernels
(``prox_logp``). The two differ (numerics, stale weights), so the policy gradient is
reweighted by ``w = pi_trainer / pi_behav``, per token or once per sequence, with a cap ``C``
that either truncates the weight (``min(w, C)``) or masks what exceeds it (``w = 0``). The
decoupled PPO loss of AReaL is the token-level, masking case.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from areal_agents.config import IMP_WEIGHT_CORRECTIONS, IMP_WEIGHT_MODES

__all__ = ["WEIGHT_METRIC_NAMES", "behav_importance_weights", "weight_metrics"]

WEIGHT_METRIC_NAMES = (
    "train/behav_imp_weight",
    "train/behav_imp_weight_max",
    "train/behav_imp_weight_min",
    "train/behav_imp_weight_capped_frac",
)


def behav_importance_weights(
    logp_trainer: Tensor, logp_behav: Tensor, mask: Tensor, mode: str, correction: str, cap: float | None
) -> tuple[Tensor, Tensor]:
    """Detached behaviour importance weights and where the cap was hit.

    ``token``: ``w_t = exp(logp_trainer_t - logp_behav_t)``; ``sequence``: one weight per row,
    ``w = exp(sum_t (logp_trainer_t - logp_behav_t))`` over its masked tokens, given to each of
    them; ``none``: ``w = 1``. A weight with ``w > cap`` (strictly) is capped: ``truncate``
    sets it to ``cap``, ``mask`` to 0 (the token, or every token of the sequence). The log
    weight is clamped at ``log(cap) + 1`` before ``exp``, so huge log ratios cannot overflow
    (and are still capped); without a cap (token mode only) nothing is clamped.

    Args: ``logp_trainer``, ``logp_behav`` ``[B, T]`` float logprobs of the sampled tokens
    (values outside ``mask`` are never read); ``mask`` ``[B, T]`` bool, True on generated
    tokens; ``mode`` one of ``IMP_WEIGHT_MODES`` (``cfg.imp_weight_mode``); ``correction`` ``mask`` or
    ``truncate``; ``cap`` the cap ``C`` (> 1) or None. Returns (``weights`` ``[B, T]``, 0
    outside ``mask``; ``capped`` ``[B, T]`` bool, False outside ``mask``).
    """
    if mode not in IMP_WEIGHT_MODES:
        raise ValueError(f"importance weight mode must be one of {', '.join(IMP_WEIGHT_MODES)} (got {mode!r})")
    if correction not in IMP_WEIGHT_CORRECTIONS:
        raise ValueError(f"behav_imp_weight_correction must be one of {', '.join(IMP_WEIGHT_CORRECTIONS)} "
                         f"(got {correction!r})")
    if logp_trainer.shape != mask.shape or logp_behav.shape != mask.shape:
        raise ValueError(f"logprobs must have the shape of the mask {tuple(mask.shape)}, got "
                         f"{tuple(logp_trainer.shape)} and {tuple(logp_behav.shape)}")
    if mode == "sequence" and cap is None:
        raise ValueError("sequence-level importance weights need a cap (behav_imp_weight_cap)")
    zero = torch.zeros((), dtype=logp_trainer.dtype, device=logp_trainer.device)
    if mode == "none":
        return torch.where(mask, zero + 1.0, zero), torch.zeros_like(mask)
    log_w = torch.where(mask, logp_trainer.detach() - logp_behav.detach(), zero)
    if mode == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    if cap is not None:
        log_w = log_w.clamp(max=math.log(cap) + 1.0)  # exp is exact below, and > cap above
    weight = torch.exp(log_w)
    capped = mask & (weight > cap) if cap is not None else torch.zeros_like(mask)
    fill = zero + cap if correction == "truncate" and cap is not None else zero
    weight = torch.where(capped, fill, weight)
    return torch.where(mask, weight, zero), capped


def weight_metrics(weights: Tensor, capped: Tensor, mask: Tensor, tokens: float) -> dict[str, Tensor]:
    """The four :data:`WEIGHT_METRIC_NAMES` of the applied ``weights`` ``[B, T]``.

    ``train/behav_imp_weight`` and ``..._capped_frac`` are sums over ``mask`` ``[B, T]``
    divided by ``tokens`` (the generated tokens of the whole batch: summed over micro-batches
    they give the batch means); ``..._max`` / ``..._min`` are the extremes over ``mask``
    (``-inf`` / ``inf`` when it is empty: reduce them with max / min, never sum them).
    """
    denom = max(tokens, 1.0)
    out = {
        "train/behav_imp_weight": torch.where(mask, weights, torch.zeros_like(weights)).sum() / denom,
        "train/behav_imp_weight_capped_frac": (capped & mask).sum().to(weights.dtype) / denom,
    }
    inf = torch.full((), math.inf, dtype=weights.dtype, device=weights.device)
    out["train/behav_imp_weight_max"] = torch.where(mask, weights, -inf).amax() if mask.numel() else -inf
    out["train/behav_imp_weight_min"] = torch.where(mask, weights, inf).amin() if mask.numel() else inf
    return out
