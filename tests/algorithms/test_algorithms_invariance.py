"""Micro-batch split invariance and the mask property (masked-out values never matter)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.advantages import (
    gae_advantages,
    gae_returns,
    gigpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from algorithms.losses import LossNorm, combine_metrics, ppo_loss
from areal_agents.config import AlgorithmConfig

D = torch.float64
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
TOKEN_KEYS = ("advantages", "logprobs", "prox_logp", "ref_logp", "values", "returns")


def random_batch(seed: int, bsz: int = 7, width: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(bsz, width, generator=g) < 0.7
    mask[0] = False  # one fully masked row
    behav = -torch.rand(bsz, width, generator=g, dtype=D) * 2
    return {
        "loss_mask": mask,
        "advantages": torch.randn(bsz, width, generator=g, dtype=D),
        "logprobs": behav,
        "prox_logp": behav + 0.4 * torch.randn(bsz, width, generator=g, dtype=D),
        "ref_logp": behav - 0.3 * torch.rand(bsz, width, generator=g, dtype=D),
        "values": torch.randn(bsz, width, generator=g, dtype=D),
        "returns": torch.randn(bsz, width, generator=g, dtype=D),
        "rewards": torch.rand(bsz, generator=g, dtype=D),
        "group_ids": torch.arange(bsz) // 3,
        "turn_returns": torch.rand(bsz, width, generator=g, dtype=D),
        "state_ids": torch.randint(0, 3, (bsz, width), generator=g),
    }


# behav_imp_weight_mode / _correction: the default (token + mask under the decoupled loss, else none) and two more
WEIGHTINGS = (("auto", "mask"), ("sequence", "truncate"), ("token", "truncate"))


def full_cfg(mode: str, decoupled: bool = True, weighting: tuple[str, str] = WEIGHTINGS[0]) -> AlgorithmConfig:
    return AlgorithmConfig(
        use_decoupled_loss=decoupled, recompute_logprob=True, behav_imp_weight_cap=1.5, c_clip=2.0,
        eps_clip_high=0.3, kl_ctl=0.1, entropy_coef=0.01, loss_agg_mode=mode,
        behav_imp_weight_mode=weighting[0], behav_imp_weight_correction=weighting[1],
    )


def run_loss(batch: dict[str, torch.Tensor], rows: list[int], cfg: AlgorithmConfig, norm: LossNorm,
             logp: torch.Tensor, entropy: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    idx = torch.tensor(rows, dtype=torch.long)
    mb = {k: v[idx] for k, v in batch.items()}
    return ppo_loss(logp[idx], mb, cfg, norm, entropy=entropy[idx], values=values[idx])


@pytest.mark.parametrize(("mode", "decoupled", "weighting"),
                         [(m, d, w) for m in MODES for d in (True, False) for w in WEIGHTINGS])
def test_summing_micro_batches_equals_full_batch(mode: str, decoupled: bool, weighting: tuple[str, str]) -> None:
    batch = random_batch(3)
    bsz = batch["loss_mask"].shape[0]
    cfg = full_cfg(mode, decoupled, weighting)
    norm = LossNorm.from_batch(batch, max_len=6)
    g = torch.Generator().manual_seed(4)
    logp0 = batch["logprobs"] + 0.3 * torch.randn(batch["logprobs"].shape, generator=g, dtype=D)
    ent0 = torch.rand(logp0.shape, generator=g, dtype=D)
    val0 = batch["values"] + 0.3 * torch.randn(logp0.shape, generator=g, dtype=D)

    def grads(splits: list[list[int]]) -> tuple[float, dict[str, float], list[torch.Tensor]]:
        leaves = [t.clone().requires_grad_() for t in (logp0, ent0, val0)]
        total, parts = 0.0, []
        for rows in splits:
            loss, m = run_loss(batch, rows, cfg, norm, *leaves)
            loss.backward()
            total += loss.item()
            parts.append(m)
        # summed, but for the *_max / *_min extremes (as the engine combines them)
        return total, combine_metrics(parts), [leaf.grad for leaf in leaves]  # type: ignore[misc]

    full_loss, full_metrics, full_grads = grads([list(range(bsz))])
    assert full_metrics["train/loss"] == pytest.approx(full_loss)
    perm = torch.randperm(bsz, generator=g).tolist()
    splits = [
        [[i] for i in range(bsz)],  # one sequence per micro-batch
        [list(range(0, 3)), list(range(3, bsz))],
        [perm[:2], perm[2:5], perm[5:]],
    ]
    for split in splits:
        loss, metrics, grad = grads(split)
        assert loss == pytest.approx(full_loss, abs=1e-12)
        assert metrics.keys() == full_metrics.keys()
        for k, v in metrics.items():
            assert v == pytest.approx(full_metrics[k], abs=1e-12), k
        for a, b in zip(grad, full_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def scramble(batch: dict[str, torch.Tensor], mask: torch.Tensor, fill: float, keys: tuple[str, ...]) -> dict:
    out = dict(batch)
    for k in keys:
        if k in out:
            out[k] = torch.where(mask, out[k], torch.full_like(out[k], fill))
    return out


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    fill=st.sampled_from([0.0, -3.5, 7.0, 1e6, float("nan"), float("inf"), -float("inf")]),
    mode=st.sampled_from(MODES),
    decoupled=st.booleans(),
    weighting=st.sampled_from(WEIGHTINGS),
)
def test_masked_out_values_never_change_loss_or_gradient(seed: int, fill: float, mode: str, decoupled: bool,
                                                         weighting: tuple[str, str]) -> None:
    batch = random_batch(seed)
    mask = batch["loss_mask"]
    cfg = full_cfg(mode, decoupled, weighting)
    norm = LossNorm.from_batch(batch, max_len=6)
    g = torch.Generator().manual_seed(seed + 1)
    inputs = [batch["logprobs"] + 0.3 * torch.randn(mask.shape, generator=g, dtype=D),
              torch.rand(mask.shape, generator=g, dtype=D), torch.randn(mask.shape, generator=g, dtype=D)]

    def evaluate(b: dict[str, torch.Tensor], tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        leaves = [t.clone().requires_grad_() for t in tensors]
        loss, _ = ppo_loss(leaves[0], b, cfg, norm, entropy=leaves[1], values=leaves[2])
        loss.backward()
        return loss.detach(), [leaf.grad for leaf in leaves]

    loss_a, grads_a = evaluate(batch, inputs)
    other = [torch.where(mask, t, torch.full_like(t, fill)) for t in inputs]
    loss_b, grads_b = evaluate(scramble(batch, mask, fill, TOKEN_KEYS), other)
    assert torch.equal(loss_a, loss_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(a[~mask], torch.zeros_like(a[~mask]))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), fill=st.sampled_from([-2.0, 5.0, float("nan"), float("inf")]),
       credit=st.sampled_from(["trajectory", "turn"]))
def test_masked_out_values_never_change_advantages(seed: int, fill: float, credit: str) -> None:
    batch = random_batch(seed)
    mask = batch["loss_mask"]
    cfg = AlgorithmConfig(use_decoupled_loss=False, kl_ctl=0.1, kl_in_reward=True, credit=credit)
    keys = ("logprobs", "prox_logp", "ref_logp", "values", "turn_returns")
    fns = [grpo_advantages, rloo_advantages, reinforce_pp_advantages, gigpo_advantages]
    if credit == "trajectory":
        fns.append(gae_advantages)
    for fn in fns:
        clean, dirty = dict(batch), scramble(batch, mask, fill, keys)
        dirty["state_ids"] = torch.where(mask, batch["state_ids"], int(fill) % 3 if math.isfinite(fill) else 7)
        a, b = fn(clean, cfg), fn(dirty, cfg)
        assert torch.equal(a, b), fn.__name__
        assert torch.equal(a[~mask], torch.zeros_like(a[~mask])), fn.__name__
    if credit == "trajectory":  # the critic's targets too
        assert torch.equal(gae_returns(dict(batch), cfg), gae_returns(scramble(batch, mask, fill, keys), cfg))


def test_turn_credit_needs_no_separator_when_returns_differ() -> None:
    # two adjacent turns (no env token between) are told apart by their different returns
    batch = {"loss_mask": torch.ones(2, 3, dtype=torch.bool), "rewards": torch.zeros(2),
             "turn_returns": torch.tensor([[1.0, 1.0, 3.0], [2.0, 2.0, 2.0]]), "group_ids": torch.zeros(2)}
    adv = grpo_advantages(batch, AlgorithmConfig(use_decoupled_loss=False, credit="turn", group_std_norm=False))
    # units 1, 3, 2 -> mean 2
    torch.testing.assert_close(adv, torch.tensor([[-1.0, -1.0, 1.0], [0.0, 0.0, 0.0]]))
