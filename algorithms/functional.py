"""Masked tensor helpers shared by the advantage estimators and the losses.

All helpers are pure: they never modify their inputs. ``B`` is the number of sequences and
``T`` the padded sequence length; a ``mask`` is a ``[B, T]`` bool tensor that is True on the
tokens the policy generated.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from areal_agents.config import KL_ESTIMATORS

__all__ = [
    "check_finite",
    "discounted_to_go",
    "float_tensor",
    "get_mask",
    "group_index",
    "kl_estimate",
    "masked_mean",
    "masked_whiten",
    "require",
    "safe_denominator",
    "seq_tensor",
    "token_tensor",
    "turn_starts",
]

_MAX_LOG_RATIO = 20.0  # k3 clamps log(ref/pi) here so exp() cannot overflow


def require(batch: Mapping[str, Tensor], key: str, needed_by: str) -> Tensor:
    """``batch[key]``, or a ValueError naming the key and what needs it."""
    if key not in batch:
        raise ValueError(f"batch is missing {key!r} (needed by {needed_by})")
    return batch[key]


def check_finite(name: str, x: Tensor, mask: Tensor | None = None) -> None:
    """Raise ValueError if ``x`` holds NaN or inf (only where ``mask`` is True, if given)."""
    bad = ~torch.isfinite(x)
    if mask is not None:
        bad = bad & mask
    if bool(bad.any()):
        where = " inside loss_mask" if mask is not None else ""
        raise ValueError(f"{name} holds {int(bad.sum())} NaN/inf value(s){where}")


def float_tensor(x: Tensor) -> Tensor:
    """``x`` as float32, or unchanged if it already is float32/float64."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def get_mask(batch: Mapping[str, Tensor]) -> Tensor:
    """``batch["loss_mask"]`` as a ``[B, T]`` bool tensor (validated)."""
    mask = require(batch, "loss_mask", "every algorithm")
    if mask.dim() != 2:
        raise ValueError(f"batch['loss_mask'] must be [B, T], got shape {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def token_tensor(x: Tensor, name: str, mask: Tensor) -> Tensor:
    """Validate a ``[B, T]`` float tensor against ``mask`` and zero it outside the mask.

    Zeroing with ``torch.where`` means masked-out entries (even NaN) reach neither the
    value nor the gradient of anything computed from the result.
    """
    if x.shape != mask.shape:
        raise ValueError(f"{name} must have the shape of loss_mask {tuple(mask.shape)}, got {tuple(x.shape)}")
    x = float_tensor(x)
    check_finite(name, x.detach(), mask)
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def seq_tensor(x: Tensor, name: str, batch_size: int) -> Tensor:
    """Validate a ``[B]`` per-sequence float tensor (every entry must be finite)."""
    if x.shape != (batch_size,):
        raise ValueError(f"{name} must have shape ({batch_size},), got {tuple(x.shape)}")
    x = float_tensor(x)
    check_finite(name, x.detach())
    return x


def safe_denominator(x: Tensor) -> Tensor:
    """``x`` with zeros replaced by 1 (used where the numerator is then exactly 0)."""
    return torch.where(x > 0, x, torch.ones_like(x))


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over True entries of ``mask`` (0 when the mask is empty); any shape."""
    total = torch.where(mask, x, torch.zeros_like(x)).sum()
    return total / mask.sum().clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, eps: float) -> Tensor:
    """``(x - mean) / (std + eps)`` over the masked entries (population std), 0 elsewhere.

    Args: ``x`` and ``mask`` of the same shape, typically ``[B, T]``.
    """
    mean = masked_mean(x, mask)
    centred = torch.where(mask, x - mean, torch.zeros_like(x))
    std = masked_mean(centred * centred, mask).sqrt()
    return centred / safe_denominator(std + eps)


def discounted_to_go(x: Tensor, mask: Tensor, discount: float) -> Tensor:
    """``G_t = x_t + discount * G_next`` over the masked tokens of each row, 0 elsewhere.

    ``next`` is the next masked token of the same row, so prompt and env tokens between
    turns are skipped and do not count as discount steps.

    Args: ``x`` ``[B, T]`` float, ``mask`` ``[B, T]`` bool. Returns ``[B, T]``.
    """
    x = torch.where(mask, x, torch.zeros_like(x))
    if discount == 1.0:
        return torch.where(mask, x.flip(-1).cumsum(-1).flip(-1), torch.zeros_like(x))
    out = torch.zeros_like(x)
    carry = torch.zeros_like(x[:, 0])
    for t in range(x.shape[1] - 1, -1, -1):
        g = x[:, t] + discount * carry
        carry = torch.where(mask[:, t], g, carry)
        out[:, t] = torch.where(mask[:, t], g, torch.zeros_like(g))
    return out


def turn_starts(mask: Tensor, turn_returns: Tensor | None = None) -> Tensor:
    """True on the first token of every turn: a maximal run of masked tokens.

    With ``turn_returns`` ``[B, T]``, a change of value inside a run also starts a new turn.
    Args: ``mask`` ``[B, T]`` bool. Returns ``[B, T]`` bool.
    """
    prev = F.pad(mask[:, :-1], (1, 0))
    starts = mask & ~prev
    if turn_returns is not None:
        starts = starts | (mask & prev & F.pad(turn_returns[:, 1:] != turn_returns[:, :-1], (1, 0)))
    return starts


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary ``[B]`` group ids to ``0..G-1``; returns (``[B]`` long index, ``G``)."""
    if group_ids.dim() != 1:
        raise ValueError(f"batch['group_ids'] must be [B], got shape {tuple(group_ids.shape)}")
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token logprobs.

    ``k1 = log pi - log ref``; ``k2 = (log pi - log ref)^2 / 2``;
    ``k3 = ref/pi - 1 - log(ref/pi)`` (non-negative, low variance; log ratio clamped to +-20).
    Args: ``logp``, ``ref_logp`` ``[B, T]``. Returns ``[B, T]``.
    """
    diff = logp - ref_logp
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff * diff
    if estimator == "k3":
        log_ratio = (-diff).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return torch.exp(log_ratio) - 1.0 - log_ratio
    raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)} (got {estimator!r})")
