"""Rollout-trainer mismatch correction: importance weights against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.importance import WEIGHT_METRIC_NAMES, behav_importance_weights, weight_metrics
from algorithms.losses import METRIC_NAMES, LossNorm, aggregate, combine_metrics, metric_reduction, ppo_loss
from areal_agents.config import AlgorithmConfig, ConfigError
from areal_agents.config.loader import load_config

D = torch.float64
NAN = float("nan")


def weights(log_ratios: list[list[float]], mask: list[list[int]], mode: str, correction: str,
            cap: float | None, dtype: torch.dtype = D) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights for behaviour logprobs -1 and trainer logprobs -1 + the given log ratios."""
    behav = torch.full((len(mask), len(mask[0])), -1.0, dtype=dtype)
    return behav_importance_weights(behav + torch.tensor(log_ratios, dtype=dtype), behav,
                                    torch.tensor(mask, dtype=torch.bool), mode, correction, cap)


def assert_weights(got: tuple[torch.Tensor, torch.Tensor], want: list[list[float]], capped: list[list[int]]) -> None:
    torch.testing.assert_close(got[0], torch.tensor(want, dtype=got[0].dtype), rtol=1e-12, atol=0)
    assert got[1].tolist() == [[bool(c) for c in row] for row in capped]


L2, LH, L10 = math.log(2.0), math.log(0.5), math.log(10.0)


def test_token_weights_truncate_and_mask() -> None:
    # w = 2, .5, 10 on generated tokens; the last token is padding (its NaN is never read)
    ratios, mask = [[L2, LH, L10, NAN]], [[1, 1, 1, 0]]
    assert_weights(weights(ratios, mask, "token", "truncate", 5.0), [[2.0, 0.5, 5.0, 0.0]], [[0, 0, 1, 0]])
    assert_weights(weights(ratios, mask, "token", "mask", 5.0), [[2.0, 0.5, 0.0, 0.0]], [[0, 0, 1, 0]])
    assert_weights(weights(ratios, mask, "token", "mask", None), [[2.0, 0.5, 10.0, 0.0]], [[0, 0, 0, 0]])
    assert_weights(weights(ratios, mask, "none", "mask", 5.0), [[1.0, 1.0, 1.0, 0.0]], [[0, 0, 0, 0]])


def test_sequence_weights_truncate_and_mask() -> None:
    # row 0: log w = .2 - .5 + .1 = -.2 (prompt token 0 and padding excluded); row 1: log w = 2 -> 7.39 > 5;
    # row 2 has no generated token: weight 0 everywhere, never capped
    ratios = [[9.0, 0.2, -0.5, 0.1, NAN], [1.0, 1.0, 0.0, NAN, NAN], [3.0, 3.0, NAN, NAN, NAN]]
    mask = [[0, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    w = math.exp(-0.2)
    assert_weights(weights(ratios, mask, "sequence", "truncate", 5.0),
                   [[0, w, w, w, 0], [5.0, 5.0, 0, 0, 0], [0] * 5], [[0] * 5, [1, 1, 0, 0, 0], [0] * 5])
    assert_weights(weights(ratios, mask, "sequence", "mask", 5.0),
                   [[0, w, w, w, 0], [0] * 5, [0] * 5], [[0] * 5, [1, 1, 0, 0, 0], [0] * 5])
    # the same ratios per token: 1.0 -> e = 2.72 is under the cap
    e = math.e
    assert_weights(weights(ratios, mask, "token", "truncate", 5.0),
                   [[0, math.exp(0.2), math.exp(-0.5), math.exp(0.1), 0], [e, e, 0, 0, 0], [0] * 5], [[0] * 5] * 3)


def test_a_weight_exactly_at_the_cap_is_not_capped() -> None:
    cap = float(torch.exp(torch.tensor(0.75, dtype=D)))  # exactly what exp gives for log w = .75
    above = 0.75 + 1e-12  # a weight just above the cap
    for correction in ("mask", "truncate"):
        assert_weights(weights([[0.75, above]], [[1, 1]], "token", correction, cap),
                       [[cap, cap if correction == "truncate" else 0.0]], [[0, 1]])
        # .5 + .25 sums to exactly .75
        assert_weights(weights([[0.5, 0.25]], [[1, 1]], "sequence", correction, cap), [[cap, cap]], [[0, 0]])


@pytest.mark.parametrize("dtype", [torch.float32, D])
def test_huge_log_ratios_do_not_overflow(dtype: torch.dtype) -> None:
    ratios, mask = [[800.0, 800.0, -800.0], [1e30, -1e30, 0.0]], [[1, 1, 1], [1, 1, 0]]
    tok = weights(ratios, mask, "token", "truncate", 5.0, dtype)
    assert_weights(tok, [[5.0, 5.0, 0.0], [5.0, 0.0, 0.0]], [[1, 1, 0], [1, 0, 0]])
    # row 0: log w = 800 (float32: exp would be inf); row 1: 1e30 - 1e30 = 0 -> w = 1
    seq = weights(ratios, mask, "sequence", "truncate", 5.0, dtype)
    assert_weights(seq, [[5.0, 5.0, 5.0], [1.0, 1.0, 0.0]], [[1, 1, 1], [0, 0, 0]])
    assert_weights(weights(ratios, mask, "sequence", "mask", 5.0, dtype), [[0.0] * 3, [1.0, 1.0, 0.0]],
                   [[1, 1, 1], [0, 0, 0]])
    assert all(bool(torch.isfinite(w).all()) for w, _ in (tok, seq))


def test_bad_arguments_are_one_clear_error() -> None:
    with pytest.raises(ValueError, match="importance weight mode must be one of none, token, sequence"):
        weights([[0.0]], [[1]], "auto", "mask", 5.0)  # the config resolves auto (AlgorithmConfig.imp_weight_mode)
    with pytest.raises(ValueError, match="importance weight mode must be one of none, token, sequence"):
        weights([[0.0]], [[1]], "tokens", "mask", 5.0)
    with pytest.raises(ValueError, match="behav_imp_weight_correction must be one of mask, truncate"):
        weights([[0.0]], [[1]], "token", "clip", 5.0)
    with pytest.raises(ValueError, match="sequence-level importance weights need a cap"):
        weights([[0.0]], [[1]], "sequence", "mask", None)
    with pytest.raises(ValueError, match="shape of the mask"):
        behav_importance_weights(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool),
                                 "token", "mask", 5.0)


def test_weight_metrics_and_their_reduction() -> None:
    w, capped = weights([[L2, LH, L10, NAN], [0.0, 0.0, 0.0, 0.0]], [[1, 1, 1, 0], [0, 0, 0, 0]],
                        "token", "truncate", 5.0)
    m = {k: float(v) for k, v in weight_metrics(w, capped, w != 0, tokens=5.0).items()}
    assert set(m) == set(WEIGHT_METRIC_NAMES) <= set(METRIC_NAMES)
    assert m == {"train/behav_imp_weight": pytest.approx(7.5 / 5), "train/behav_imp_weight_max": 5.0,
                 "train/behav_imp_weight_min": pytest.approx(0.5), "train/behav_imp_weight_capped_frac": pytest.approx(0.2)}
    empty = {k: float(v) for k, v in weight_metrics(w[1:], capped[1:], w[1:] != 0, tokens=5.0).items()}
    assert empty == {"train/behav_imp_weight": 0.0, "train/behav_imp_weight_max": -math.inf,
                     "train/behav_imp_weight_min": math.inf, "train/behav_imp_weight_capped_frac": 0.0}
    # an empty micro-batch leaves the extremes of the others; the means add up
    other = {"train/behav_imp_weight": 0.2, "train/behav_imp_weight_max": 1.0, "train/behav_imp_weight_min": 1.0,
             "train/behav_imp_weight_capped_frac": 0.0}
    assert combine_metrics([m, empty, other]) == {**m, "train/behav_imp_weight": pytest.approx(1.7)}
    assert [metric_reduction(k) for k in ("train/loss", "a_max", "a_min", "a_minimum")] == ["sum", "max", "min", "sum"]


def cfg(**kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(**{"use_decoupled_loss": False, "recompute_logprob": True, **kw})  # type: ignore[arg-type]


def mismatch_batch(seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A batch with behaviour logprobs off the trainer's by up to ~1 nat, one empty row, NaN padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 5, generator=g) < 0.7
    mask[0] = False
    prox = -torch.rand(6, 5, generator=g, dtype=D) * 2
    pad = torch.full_like(prox, NAN)
    batch = {"loss_mask": mask, "advantages": torch.where(mask, torch.randn(6, 5, generator=g, dtype=D), pad),
             "prox_logp": torch.where(mask, prox, pad),
             "logprobs": torch.where(mask, prox + 0.6 * torch.randn(6, 5, generator=g, dtype=D), pad)}
    return torch.where(mask, prox + 0.1 * torch.randn(6, 5, generator=g, dtype=D), pad), batch


def legacy_decoupled_pg(logp: torch.Tensor, batch: dict[str, torch.Tensor], c: AlgorithmConfig,
                        norm: LossNorm) -> torch.Tensor:
    """The decoupled policy loss as it was written before the mismatch correction existed."""
    mask = batch["loss_mask"]
    z = torch.zeros((), dtype=D)
    logp, adv, old, behav = (torch.where(mask, batch[k] if k else logp, z)
                             for k in (None, "advantages", "prox_logp", "logprobs"))
    ratio = torch.exp(logp - old)
    high = c.eps_clip if c.eps_clip_high is None else c.eps_clip_high
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - c.eps_clip, 1.0 + high))
    if c.c_clip is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * c.c_clip), pg)
    weight = torch.exp(old - behav).detach()
    if c.behav_imp_weight_cap is not None:
        weight = torch.where(mask & (weight > c.behav_imp_weight_cap), torch.zeros_like(weight), weight)
    return aggregate(pg * weight, mask, c.loss_agg_mode, norm)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("cap", [1.5, 5.0, None])
def test_defaults_reproduce_the_decoupled_loss_exactly(agg: str, cap: float | None) -> None:
    logp0, batch = mismatch_batch(7)
    norm = LossNorm.from_batch(batch, 5)
    decoupled = cfg(use_decoupled_loss=True, behav_imp_weight_cap=cap, c_clip=3.0, loss_agg_mode=agg)
    assert AlgorithmConfig().imp_weight_mode == "token" and AlgorithmConfig().behav_imp_weight_correction == "mask"
    assert decoupled.behav_imp_weight_mode == "auto" and decoupled.imp_weight_mode == "token"
    want_logp = logp0.clone().requires_grad_()
    want = legacy_decoupled_pg(want_logp, batch, decoupled, norm)
    want.backward()
    # the default, the same spelled out, and token weights on the plain PPO loss: one and the same loss
    same = (decoupled, cfg(use_decoupled_loss=True, behav_imp_weight_cap=cap, c_clip=3.0, loss_agg_mode=agg,
                           behav_imp_weight_mode="token", behav_imp_weight_correction="mask"),
            cfg(behav_imp_weight_cap=cap, c_clip=3.0, loss_agg_mode=agg, behav_imp_weight_mode="token"))
    for c in same:
        logp = logp0.clone().requires_grad_()
        loss, m = ppo_loss(logp, batch, c, norm)
        loss.backward()
        assert torch.equal(loss.detach(), want.detach()) and logp.grad is not None
        assert torch.equal(logp.grad, want_logp.grad)  # type: ignore[arg-type]
        assert m["train/behav_imp_weight_max"] >= m["train/behav_imp_weight_min"] >= 0
        assert ("train/imp_weight_mean" in m) == c.use_decoupled_loss
        if c.use_decoupled_loss:  # the old names stay, with the same numbers
            assert m["train/imp_weight_mean"] == m["train/behav_imp_weight"]
            if cap is not None:
                frac = m["train/behav_imp_weight_capped_frac"]
                assert m["train/imp_weight_capped_frac"] == frac and (frac > 0 or cap > 2)
    # no correction: no weight and no weight metrics
    _, m = ppo_loss(logp0, batch, cfg(behav_imp_weight_cap=cap), norm)
    assert not set(WEIGHT_METRIC_NAMES) & set(m)


@pytest.mark.parametrize(("mode", "correction"), [(m, c) for m in ("token", "sequence") for c in ("mask", "truncate")])
def test_policy_gradient_is_scaled_by_the_weight(mode: str, correction: str) -> None:
    logp0, batch = mismatch_batch(11)
    norm = LossNorm.from_batch(batch, 5)
    grads, losses = [], []
    for c in (cfg(eps_clip=10.0), cfg(behav_imp_weight_mode=mode, behav_imp_weight_correction=correction,
                                      eps_clip=10.0, behav_imp_weight_cap=1.5)):
        logp = logp0.clone().requires_grad_()
        loss, metrics = ppo_loss(logp, batch, c, norm)
        loss.backward()
        grads.append(logp.grad)
        losses.append(loss.item())
    mask = batch["loss_mask"]
    w, capped = behav_importance_weights(batch["prox_logp"], batch["logprobs"], mask, mode, correction, 1.5)
    assert bool(capped.any()) and bool((w[mask & ~capped] != 1).all())
    # no token is clipped (ratios ~ exp(+-.3) inside 1 +- 10), so every gradient is -A r w / tokens
    ratio = torch.exp(torch.where(mask, logp0 - batch["prox_logp"], torch.zeros_like(logp0)))
    want = torch.where(mask, -batch["advantages"] * ratio * w, torch.zeros_like(w)) / norm.tokens
    torch.testing.assert_close(grads[1], want, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grads[1], grads[0] * w, rtol=1e-12, atol=1e-15)
    assert metrics["train/behav_imp_weight"] == pytest.approx(float(w.sum()) / norm.tokens)
    assert metrics["train/behav_imp_weight_capped_frac"] == pytest.approx(float(capped.sum()) / norm.tokens)
    assert metrics["train/behav_imp_weight_max"] == float(w[mask].max())
    assert metrics["train/behav_imp_weight_min"] == float(w[mask].min())


def test_the_correction_needs_the_trainers_logprobs() -> None:
    logp, batch = mismatch_batch(3)
    del batch["prox_logp"]
    with pytest.raises(ValueError, match=r"'prox_logp' \(needed by the mismatch correction "
                                         r"\(algorithm.behav_imp_weight_mode=sequence\)\)"):
        ppo_loss(logp, batch, cfg(behav_imp_weight_mode="sequence"), LossNorm.from_batch(batch, 5))


@pytest.mark.parametrize(("overrides", "line"), [
    (["algorithm.behav_imp_weight_mode=token"],  # grpo: no recomputed logprobs
     "algorithm.behav_imp_weight_mode: token needs the trainer's own logprobs: set algorithm.recompute_logprob=true"),
    (["algorithm.name=decoupled-ppo", "algorithm.behav_imp_weight_mode=none"],
     "algorithm.behav_imp_weight_mode: none contradicts use_decoupled_loss=true"),
    (["algorithm.name=decoupled-ppo", "algorithm.behav_imp_weight_mode=sequence", "algorithm.behav_imp_weight_cap=null"],
     "algorithm.behav_imp_weight_cap: behav_imp_weight_mode=sequence needs a cap"),
    (["algorithm.name=decoupled-ppo", "algorithm.behav_imp_weight_correction=truncate",
      "algorithm.behav_imp_weight_cap=null"],
     "algorithm.behav_imp_weight_cap: behav_imp_weight_correction=truncate needs a cap to truncate at"),
    (["algorithm.behav_imp_weight_mode=seq"],
     "algorithm.behav_imp_weight_mode: must be one of auto, none, token, sequence (got 'seq')"),
    (["algorithm.behav_imp_weight_mode=off"],  # YAML reads off as false
     "algorithm.behav_imp_weight_mode: must be one of auto, none, token, sequence (got 'False')"),
])
def test_bad_combinations_are_one_config_line(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_good_combinations_load() -> None:
    seq = load_config(overrides=["algorithm.name=decoupled-ppo", "algorithm.behav_imp_weight_mode=sequence",
                                 "algorithm.behav_imp_weight_correction=truncate"]).algorithm
    assert (seq.imp_weight_mode, seq.behav_imp_weight_correction, seq.behav_imp_weight_cap) == ("sequence", "truncate", 5.0)
    grpo = load_config(overrides=["algorithm.recompute_logprob=true", "algorithm.behav_imp_weight_mode=token"])
    assert grpo.algorithm.imp_weight_mode == "token" and not grpo.algorithm.use_decoupled_loss
    assert load_config().algorithm.imp_weight_mode == "none"  # grpo's defaults: no decoupling, no correction
