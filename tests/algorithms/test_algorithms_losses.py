"""Losses against hand-computed numbers, gradient checks and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.functional import kl_estimate
from algorithms.losses import METRIC_NAMES, LossNorm, aggregate, ppo_loss, value_loss
from areal_agents.config import AlgorithmConfig

D = torch.float64


def cfg(**kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(**{"use_decoupled_loss": False, "recompute_logprob": False, **kw})  # type: ignore[arg-type]


def one_row(ratios: list[float], adv: list[float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A single sequence of len(ratios) generated tokens plus one padding token."""
    n = len(ratios)
    behav = torch.tensor([[-1.0] * n + [0.0]], dtype=D)
    logp = behav + torch.log(torch.tensor([ratios + [1.0]], dtype=D))
    batch = {
        "loss_mask": torch.tensor([[True] * n + [False]]),
        "advantages": torch.tensor([adv + [0.0]], dtype=D),
        "logprobs": behav,
    }
    return logp, batch


def test_loss_norm_from_batch() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 1]], dtype=torch.bool)
    assert LossNorm.from_batch({"loss_mask": mask}, 8) == LossNorm(tokens=4.0, seqs=2.0, max_len=8.0)
    with pytest.raises(ValueError, match="max_len"):
        LossNorm(1, 1, 0)


def test_aggregation_modes_hand_computed() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    norm = LossNorm(tokens=4, seqs=2, max_len=5)
    assert aggregate(x, mask, "token-mean", norm).item() == pytest.approx(10 / 4)
    assert aggregate(x, mask, "seq-mean-token-mean", norm).item() == pytest.approx((2 + 4) / 2)
    assert aggregate(x, mask, "seq-mean-token-sum-norm", norm).item() == pytest.approx((6 / 5 + 4 / 5) / 2)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(x, mask, "mean", norm)


def test_ppo_clip_hand_computed() -> None:
    # ratios 1.5, .5, 1.1 with A = 1, -1, 2 and eps .2: -1.2 (clipped), .8 (clipped), -2.2
    logp, batch = one_row([1.5, 0.5, 1.1], [1.0, -1.0, 2.0])
    norm = LossNorm.from_batch(batch, 4)
    loss, m = ppo_loss(logp, batch, cfg(), norm)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.2) / 3)
    assert m["train/pg_loss"] == pytest.approx(loss.item()) and m["train/loss"] == pytest.approx(loss.item())
    assert m["train/clip_frac"] == pytest.approx(2 / 3)
    # approx_kl is k3 of the ratio: r - 1 - log r
    k3 = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1.1)) / 3
    assert m["train/approx_kl"] == pytest.approx(k3)
    assert set(m) <= set(METRIC_NAMES) and "train/dual_clip_frac" not in m
    # clip-higher: 1.5 < 1 + .6 is no longer clipped on the high side
    loss, m = ppo_loss(logp, batch, cfg(eps_clip_high=0.6), norm)
    assert loss.item() == pytest.approx((-1.5 + 0.8 - 2.2) / 3) and m["train/clip_frac"] == pytest.approx(1 / 3)


def test_dual_clip_bounds_negative_advantages() -> None:
    # ratio 5 with A = -1: PPO gives max(5, .8) = 5; dual clip c = 3 caps it at 3
    logp, batch = one_row([5.0, 1.0], [-1.0, 1.0])
    norm = LossNorm.from_batch(batch, 4)
    loss, _ = ppo_loss(logp, batch, cfg(), norm)
    assert loss.item() == pytest.approx((5.0 - 1.0) / 2)
    logp.requires_grad_()
    loss, m = ppo_loss(logp, batch, cfg(c_clip=3.0), norm)
    assert loss.item() == pytest.approx((3.0 - 1.0) / 2) and m["train/dual_clip_frac"] == pytest.approx(1 / 2)
    loss.backward()
    # the dual-clipped token is constant; the other has d(-A r)/dlogp = -A r = -1, over 2 tokens
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5, 0.0]], dtype=D))


def test_decoupled_loss_hand_computed() -> None:
    # ratio vs prox 1.5, .5, 1.1; behaviour weight exp(prox - behav) = 2, .5, 10 -> 10 > cap 5 is masked
    logp, batch = one_row([1.5, 0.5, 1.1], [1.0, -1.0, 2.0])
    prox = batch["logprobs"].clone()
    batch["logprobs"] = prox - torch.log(torch.tensor([[2.0, 0.5, 10.0, 1.0]], dtype=D))
    batch["prox_logp"] = prox
    norm = LossNorm.from_batch(batch, 4)
    c = cfg(use_decoupled_loss=True, recompute_logprob=True, behav_imp_weight_cap=5.0)
    loss, m = ppo_loss(logp, batch, c, norm)
    assert loss.item() == pytest.approx((-1.2 * 2 + 0.8 * 0.5 + 0.0) / 3)
    assert m["train/imp_weight_mean"] == pytest.approx(2.5 / 3)
    assert m["train/imp_weight_capped_frac"] == pytest.approx(1 / 3)
    # without decoupling but with recomputed logprobs, prox is the PPO "old" policy
    loss, _ = ppo_loss(logp, batch, cfg(recompute_logprob=True), norm)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.2) / 3)
    with pytest.raises(ValueError, match="prox_logp"):
        ppo_loss(logp, {k: v for k, v in batch.items() if k != "prox_logp"}, c, norm)


def test_kl_estimators_hand_computed() -> None:
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(logp, ref, "k4")


def test_kl_and_entropy_terms() -> None:
    logp, batch = one_row([1.0, 1.0], [0.0, 0.0])  # zero advantages: only the extra terms remain
    batch["ref_logp"] = logp.detach() - 0.5  # k1 = 0.5 per token
    norm = LossNorm.from_batch(batch, 4)
    entropy = torch.tensor([[1.0, 3.0, 99.0]], dtype=D)
    loss, m = ppo_loss(logp, batch, cfg(kl_ctl=0.1, kl_estimator="k1", entropy_coef=0.01), norm, entropy=entropy)
    assert loss.item() == pytest.approx(0.1 * 0.5 - 0.01 * 2.0)
    assert m["train/kl_ref"] == pytest.approx(0.5) and m["train/entropy"] == pytest.approx(2.0)
    loss, m = ppo_loss(logp, batch, cfg(kl_ctl=0.1, kl_in_reward=True), norm)  # KL lives in the reward
    assert loss.item() == pytest.approx(0.0) and "train/kl_ref" in m
    with pytest.raises(ValueError, match="ref_logp"):
        ppo_loss(logp, {k: v for k, v in batch.items() if k != "ref_logp"}, cfg(kl_ctl=0.1), norm)
    with pytest.raises(ValueError, match="entropy"):
        ppo_loss(logp, batch, cfg(entropy_coef=0.01), norm)


def test_value_loss_hand_computed() -> None:
    # v = 1, 0; old = .5, .5; returns 2, 0; clip .2 -> clipped v .7, .3 -> .5 * 1.69, .5 * .09
    batch = {
        "loss_mask": torch.tensor([[True, True, False]]),
        "values": torch.tensor([[0.5, 0.5, 7.0]], dtype=D),
        "returns": torch.tensor([[2.0, 0.0, 7.0]], dtype=D),
    }
    values = torch.tensor([[1.0, 0.0, 5.0]], dtype=D, requires_grad=True)
    norm = LossNorm.from_batch(batch, 4)
    loss, m = value_loss(values, batch, cfg(), norm)
    assert loss.item() == pytest.approx((0.845 + 0.045) / 2) and m["train/value_loss"] == pytest.approx(loss.item())
    loss.backward()
    # token 0: the clipped branch is constant -> gradient 0; token 1: d/dv .5 v^2 / 2 = 0 at v = 0
    assert values.grad is not None and values.grad.tolist() == [[0.0, 0.0, 0.0]]
    # the policy loss adds it when values are passed
    logp, pb = one_row([1.0, 1.0], [0.0, 0.0])
    pb.update(batch)
    total, m = ppo_loss(logp, pb, cfg(), norm, values=values)
    assert total.item() == pytest.approx(0.445) and m["train/value_loss"] == pytest.approx(0.445)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradcheck_policy_loss(mode: str) -> None:
    g = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    behav = -torch.rand(3, 4, generator=g, dtype=D) - 0.5
    batch = {
        "loss_mask": mask,
        "advantages": torch.randn(3, 4, generator=g, dtype=D),
        "logprobs": behav,
        "prox_logp": behav + 0.3 * torch.randn(3, 4, generator=g, dtype=D),
        "ref_logp": behav - 0.2,
    }
    norm = LossNorm.from_batch(batch, 6)
    c = cfg(use_decoupled_loss=True, recompute_logprob=True, c_clip=3.0, eps_clip_high=0.3, kl_ctl=0.05,
            entropy_coef=0.01, loss_agg_mode=mode)
    logp = (behav + 0.25 * torch.randn(3, 4, generator=g, dtype=D)).requires_grad_()
    entropy = torch.rand(3, 4, generator=g, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda lp, h: ppo_loss(lp, batch, c, norm, entropy=h)[0], (logp, entropy))


def test_gradcheck_value_loss_and_kl() -> None:
    g = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    batch = {"loss_mask": mask, "values": torch.randn(2, 3, generator=g, dtype=D),
             "returns": torch.randn(2, 3, generator=g, dtype=D)}
    values = torch.randn(2, 3, generator=g, dtype=D, requires_grad=True)
    norm = LossNorm.from_batch(batch, 3)
    assert torch.autograd.gradcheck(lambda v: value_loss(v, batch, cfg(value_eps_clip=0.5), norm)[0], (values,))
    ref = torch.randn(2, 3, generator=g, dtype=D)
    for est in ("k1", "k2", "k3"):
        assert torch.autograd.gradcheck(lambda lp, e=est: kl_estimate(lp, ref, e).sum(), (values,))


def test_non_finite_inputs_are_rejected() -> None:
    logp, batch = one_row([1.0, 1.0], [1.0, 1.0])
    norm = LossNorm.from_batch(batch, 4)
    bad = logp.clone()
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="logp holds 1 NaN/inf value"):
        ppo_loss(bad, batch, cfg(), norm)
    batch["advantages"] = torch.tensor([[1.0, float("inf"), 0.0]], dtype=D)
    with pytest.raises(ValueError, match=r"batch\['advantages'\] holds 1 NaN/inf"):
        ppo_loss(logp, batch, cfg(), norm)
    batch["advantages"] = torch.tensor([[1.0, 1.0, float("nan")]], dtype=D)  # masked out: fine
    loss, _ = ppo_loss(logp, batch, cfg(), norm)
    assert loss.item() == pytest.approx(-1.0)


def test_empty_batch_gives_zero_loss_and_finite_gradient() -> None:
    batch = {"loss_mask": torch.zeros(2, 3, dtype=torch.bool), "advantages": torch.ones(2, 3),
             "logprobs": torch.zeros(2, 3)}
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    loss, m = ppo_loss(logp, batch, cfg(), LossNorm.from_batch(batch, 3))
    loss.backward()
    assert loss.item() == 0.0 and m["train/clip_frac"] == 0.0
    assert logp.grad is not None and torch.equal(logp.grad, torch.zeros(2, 3))
