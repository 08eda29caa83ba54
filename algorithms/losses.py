"""Policy and value losses with global normalisation across micro-batches and ranks.

``fn(logp, batch, cfg, norm, *, entropy=None, values=None) -> (loss, metrics)``.

Every term is a sum over the micro-batch divided by a denominator of the WHOLE batch held in
:class:`LossNorm`, so summing the losses (and the metrics) of all micro-batches of all ranks
gives exactly the full-batch value for every ``loss_agg_mode``. Metrics are token-weighted
sums divided by ``norm.tokens`` (``train/loss``, ``train/pg_loss`` and ``train/value_loss``
are the aggregated loss terms themselves): sum them over micro-batches and ranks, never
average them. The exceptions are named ``*_max`` / ``*_min`` (extremes over the micro-batch):
reduce those with max / min (:func:`metric_reduction`, :func:`combine_metrics`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from algorithms.functional import get_mask, kl_estimate, require, token_tensor
from algorithms.importance import WEIGHT_METRIC_NAMES, behav_importance_weights, weight_metrics
from areal_agents.config import LOSS_AGG_MODES, AlgorithmConfig

__all__ = [
    "METRIC_NAMES",
    "LossNorm",
    "aggregate",
    "combine_metrics",
    "metric_reduction",
    "ppo_loss",
    "value_loss",
]

METRIC_NAMES = (
    "train/loss",
    "train/pg_loss",
    "train/clip_frac",
    "train/dual_clip_frac",
    "train/approx_kl",
    "train/imp_weight_mean",
    "train/imp_weight_capped_frac",
    *WEIGHT_METRIC_NAMES,
    "train/entropy",
    "train/kl_ref",
    "train/value_loss",
)


def metric_reduction(name: str) -> str:
    """How the values of metric ``name`` from several micro-batches (or ranks) combine:
    ``max`` for a name ending in ``_max``, ``min`` for ``_min``, else ``sum``."""
    if name.endswith("_max"):
        return "max"
    if name.endswith("_min"):
        return "min"
    return "sum"


def combine_metrics(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The metrics of a whole batch from those of its micro-batches (:func:`metric_reduction`)."""
    ops: dict[str, Callable[[float, float], float]] = {"sum": operator.add, "max": max, "min": min}
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = ops[metric_reduction(k)](out[k], float(v)) if k in out else float(v)
    return out


@dataclass(frozen=True)
class LossNorm:
    """Denominators over the whole training batch (all micro-batches, all ranks).

    ``tokens``: loss-masked tokens; ``seqs``: sequences with at least one masked token;
    ``max_len``: fixed per-sequence normaliser of ``seq-mean-token-sum-norm`` (Dr.GRPO),
    e.g. the response length cap. A zero count is treated as 1 (the loss is then 0).
    """

    tokens: float
    seqs: float
    max_len: float

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.seqs < 0:
            raise ValueError(f"LossNorm counts must be >= 0 (got tokens={self.tokens}, seqs={self.seqs})")
        if self.max_len <= 0:
            raise ValueError(f"LossNorm.max_len must be > 0 (got {self.max_len})")

    @classmethod
    def from_batch(cls, batch: Mapping[str, Tensor], max_len: float) -> LossNorm:
        """Denominators of one batch (``loss_mask`` ``[B, T]``) when it is the whole batch."""
        mask = get_mask(batch)
        return cls(tokens=float(mask.sum()), seqs=float((mask.sum(-1) > 0).sum()), max_len=float(max_len))


def aggregate(x: Tensor, mask: Tensor, mode: str, norm: LossNorm) -> Tensor:
    """Reduce per-token values ``x`` ``[B, T]`` over ``mask`` ``[B, T]`` to a scalar.

    ``token-mean``: ``sum(x) / norm.tokens``; ``seq-mean-token-mean``:
    ``sum_b(sum_t x / n_b) / norm.seqs``; ``seq-mean-token-sum-norm``:
    ``sum_b(sum_t x / norm.max_len) / norm.seqs`` (``n_b``: masked tokens of row ``b``).
    """
    x = torch.where(mask, x, torch.zeros_like(x))
    if mode == "token-mean":
        return x.sum() / max(norm.tokens, 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = x.sum(-1) / mask.sum(-1).clamp(min=1).to(x.dtype)
        return per_seq.sum() / max(norm.seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        return (x.sum(-1) / norm.max_len).sum() / max(norm.seqs, 1.0)
    raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)} (got {mode!r})")


def value_loss(
    values: Tensor, batch: Mapping[str, Tensor], cfg: AlgorithmConfig, norm: LossNorm
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-value_eps_clip) - R)^2)``.

    Args: ``values`` ``[B, T]`` new critic estimates (with grad); ``batch["values"]``
    ``[B, T]`` old estimates; ``batch["returns"]`` ``[B, T]`` targets (written by GAE).
    Aggregated with ``loss_agg_mode``. Returns (scalar, ``{"train/value_loss": ...}``).
    """
    mask = get_mask(batch)
    v = token_tensor(values, "values", mask)
    old = token_tensor(require(batch, "values", "the value loss"), "batch['values']", mask).to(v.dtype)
    ret = token_tensor(require(batch, "returns", "the value loss"), "batch['returns']", mask).to(v.dtype)
    clipped = old + (v - old).clamp(-cfg.value_eps_clip, cfg.value_eps_clip)
    per_token = 0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2)
    loss = aggregate(per_token, mask, cfg.loss_agg_mode, norm)
    return loss, {"train/value_loss": float(loss.detach())}


def ppo_loss(
    logp: Tensor,
    batch: Mapping[str, Tensor],
    cfg: AlgorithmConfig,
    norm: LossNorm,
    *,
    entropy: Tensor | None = None,
    values: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (asymmetric clip, dual clip), optionally AReaL-decoupled.

    ``r = exp(logp - old)``; ``pg = max(-A r, -A clip(r, 1 - eps_clip, 1 + eps_clip_high))``;
    with ``c_clip`` and ``A < 0``: ``pg = min(pg, -c_clip A)``. Mismatch correction
    (``cfg.imp_weight_mode`` token or sequence): ``pg *= w``, the detached behaviour weight of
    :func:`~algorithms.importance.behav_importance_weights` from ``prox_logp`` vs
    ``logprobs``, capped at ``behav_imp_weight_cap`` by ``behav_imp_weight_correction``.
    Decoupled (``use_decoupled_loss``) is its token-level case (by default masking: ``w = 0``
    where ``w > cap``) with ``old = prox_logp``. Otherwise ``old`` is ``prox_logp`` if
    ``recompute_logprob`` and present (always with a correction), else ``logprobs``.
    Adds ``kl_ctl * KL(pi || ref)`` (unless ``kl_in_reward``), ``-entropy_coef * H`` and,
    when ``values`` is given, :func:`value_loss` (the critic has its own parameters).

    Args: ``logp`` ``[B, T]`` current logprobs of the sampled tokens (with grad);
    ``batch``: the micro-batch with ``loss_mask``, ``advantages``, ``logprobs`` (+
    ``prox_logp``, ``ref_logp``, ``values``, ``returns`` as needed), all ``[B, T]``;
    ``entropy`` ``[B, T]`` token entropies; ``values`` ``[B, T]`` new critic estimates.
    Returns (scalar loss, metrics named as in :data:`METRIC_NAMES`).
    """
    mask = get_mask(batch)
    logp = token_tensor(logp, "logp", mask)
    adv = _token(batch, "advantages", "the policy loss", mask, logp.dtype)
    old, behav = _old_logprobs(batch, cfg, mask, logp.dtype)
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    pg, stats = _clipped_surrogate(ratio, adv, cfg, mask, norm)
    pg, weight_stats = _importance_weighted(pg, old, behav, cfg, mask, norm)
    stats.update(weight_stats)
    stats["train/approx_kl"] = aggregate((ratio - 1.0 - log_ratio).detach(), mask, "token-mean", norm)
    pg_loss = aggregate(pg, mask, cfg.loss_agg_mode, norm)
    loss, kl_stats = _add_kl(pg_loss, logp, batch, cfg, mask, norm)
    stats.update(kl_stats)
    loss, entropy_stats = _add_entropy(loss, entropy, cfg, mask, norm, logp.dtype)
    stats.update(entropy_stats)
    if values is not None:
        v_loss, _ = value_loss(values, batch, cfg, norm)
        stats["train/value_loss"] = v_loss
        loss = loss + v_loss
    stats["train/pg_loss"] = pg_loss
    stats["train/loss"] = loss
    return loss, _as_floats(stats)


def _token(batch: Mapping[str, Tensor], key: str, needed_by: str, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``batch[key]`` ``[B, T]``, checked against ``mask`` ``[B, T]`` and cast to ``dtype``; a
    missing key fails naming ``needed_by``."""
    return token_tensor(require(batch, key, needed_by), f"batch[{key!r}]", mask).to(dtype)


def _old_logprobs(batch: Mapping[str, Tensor], cfg: AlgorithmConfig, mask: Tensor,
                  dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(old, behav)``, both ``[B, T]``: the logprobs the ratio is taken against and the
    behaviour policy's (``batch["logprobs"]``). ``old`` is ``prox_logp`` for the decoupled loss and
    any mismatch correction (required then), and with ``recompute_logprob`` when present;
    otherwise it is ``behav``."""
    behav = _token(batch, "logprobs", "the policy loss", mask, dtype)
    mode = cfg.imp_weight_mode
    if cfg.use_decoupled_loss:
        return _token(batch, "prox_logp", "the decoupled loss (algorithm.use_decoupled_loss)", mask, dtype), behav
    if mode != "none":
        needed_by = f"the mismatch correction (algorithm.behav_imp_weight_mode={mode})"
        return _token(batch, "prox_logp", needed_by, mask, dtype), behav
    if cfg.recompute_logprob and "prox_logp" in batch:
        return _token(batch, "prox_logp", "the policy loss", mask, dtype), behav
    return behav, behav


def _clipped_surrogate(ratio: Tensor, adv: Tensor, cfg: AlgorithmConfig, mask: Tensor,
                       norm: LossNorm) -> tuple[Tensor, dict[str, Tensor]]:
    """The per-token PPO objective to minimise, ``[B, T]``, from ``ratio`` and ``adv`` ``[B, T]``:
    ``max(-A r, -A clip(r, 1 - eps_clip, 1 + eps_clip_high))``, then with ``c_clip`` and ``A < 0``
    at most ``-c_clip A``. Metrics (scalars): ``train/clip_frac`` and, with ``c_clip``,
    ``train/dual_clip_frac``."""
    high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    surr = -adv * ratio
    surr_clipped = -adv * ratio.clamp(1.0 - cfg.eps_clip, 1.0 + high)
    pg = torch.maximum(surr, surr_clipped)
    stats = {"train/clip_frac": aggregate((surr_clipped > surr).to(ratio.dtype), mask, "token-mean", norm)}
    if cfg.c_clip is not None:
        bound = -adv * cfg.c_clip
        dual = (adv < 0) & (pg > bound)
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
        stats["train/dual_clip_frac"] = aggregate(dual.to(ratio.dtype), mask, "token-mean", norm)
    return pg, stats


def _importance_weighted(pg: Tensor, old: Tensor, behav: Tensor, cfg: AlgorithmConfig, mask: Tensor,
                         norm: LossNorm) -> tuple[Tensor, dict[str, Tensor]]:
    """``pg`` ``[B, T]`` times the detached behaviour importance weight of ``old`` vs ``behav``
    (``[B, T]``; :func:`~algorithms.importance.behav_importance_weights`), with its metrics;
    ``pg`` unchanged and no metrics when ``imp_weight_mode`` is ``none``. The decoupled loss also
    logs them under its historical names (``train/imp_weight_*``)."""
    mode = cfg.imp_weight_mode
    if mode == "none":
        return pg, {}
    cap = cfg.behav_imp_weight_cap
    weight, capped = behav_importance_weights(old, behav, mask, mode, cfg.behav_imp_weight_correction, cap)
    stats = dict(weight_metrics(weight, capped, mask, norm.tokens))
    if cfg.use_decoupled_loss:
        stats["train/imp_weight_mean"] = stats["train/behav_imp_weight"]
        if cap is not None:
            stats["train/imp_weight_capped_frac"] = stats["train/behav_imp_weight_capped_frac"]
    return pg * weight, stats


def _add_kl(loss: Tensor, logp: Tensor, batch: Mapping[str, Tensor], cfg: AlgorithmConfig, mask: Tensor,
            norm: LossNorm) -> tuple[Tensor, dict[str, Tensor]]:
    """``loss`` (scalar) plus ``kl_ctl * KL(pi || ref)`` of ``logp`` vs ``batch["ref_logp"]``
    (``[B, T]``) unless ``kl_in_reward``; ``train/kl_ref`` whenever ``ref_logp`` is there."""
    kl_as_loss = cfg.kl_ctl > 0 and not cfg.kl_in_reward
    if not (kl_as_loss or "ref_logp" in batch):
        return loss, {}
    ref = _token(batch, "ref_logp", "algorithm.kl_ctl > 0", mask, logp.dtype)
    kl = kl_estimate(logp, ref, cfg.kl_estimator)
    stats = {"train/kl_ref": aggregate(kl.detach(), mask, "token-mean", norm)}
    if kl_as_loss:
        loss = loss + cfg.kl_ctl * aggregate(kl, mask, cfg.loss_agg_mode, norm)
    return loss, stats


def _add_entropy(loss: Tensor, entropy: Tensor | None, cfg: AlgorithmConfig, mask: Tensor, norm: LossNorm,
                 dtype: torch.dtype) -> tuple[Tensor, dict[str, Tensor]]:
    """``loss`` (scalar) minus ``entropy_coef * H`` of the token entropies ``[B, T]`` (cast to
    ``dtype``, the policy logprobs'), and ``train/entropy``; without entropies ``entropy_coef``
    must be 0."""
    if entropy is None:
        if cfg.entropy_coef != 0:
            raise ValueError("algorithm.entropy_coef != 0 needs the token entropies: pass entropy=[B, T]")
        return loss, {}
    ent = token_tensor(entropy, "entropy", mask).to(dtype)
    stats = {"train/entropy": aggregate(ent.detach(), mask, "token-mean", norm)}
    if cfg.entropy_coef != 0:
        loss = loss - cfg.entropy_coef * aggregate(ent, mask, cfg.loss_agg_mode, norm)
    return loss, stats


def _as_floats(stats: Mapping[str, Tensor]) -> dict[str, float]:
    """Scalar tensor metrics as floats, in one device-to-host copy."""
    names = list(stats)
    numbers = torch.stack([stats[k].detach().to(torch.float64) for k in names]).tolist()
    return dict(zip(names, numbers, strict=True))
