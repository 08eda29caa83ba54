"""Advantage estimators and reward shaping against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.advantages import (
    dr_grpo_advantages,
    gae_advantages,
    gae_returns,
    grpo_advantages,
    reinforce_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from algorithms.shaping import overlong_penalty, shape_rewards
from areal_agents.config import AlgorithmConfig

F = torch.float32


def mask_of(lengths: list[int], width: int = 4) -> torch.Tensor:
    """Rows with the first ``n`` tokens generated."""
    return torch.tensor([[t < n for t in range(width)] for n in lengths])


def make_batch(rewards: list[float], lengths: list[int], groups: list[int], width: int = 4) -> dict[str, torch.Tensor]:
    mask = mask_of(lengths, width)
    return {
        "loss_mask": mask,
        "rewards": torch.tensor(rewards, dtype=F),
        "group_ids": torch.tensor(groups),
        "logprobs": torch.where(mask, -1.0, 0.0),
        "no_eos": torch.zeros(len(rewards), dtype=torch.bool),
        "response_lengths": torch.tensor(lengths),
    }


def cfg(**kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(**{"use_decoupled_loss": False, **kw})  # type: ignore[arg-type]


def expect(adv: torch.Tensor, rows: list[list[float]]) -> None:
    torch.testing.assert_close(adv, torch.tensor(rows, dtype=adv.dtype), atol=1e-6, rtol=1e-6)


# -- group estimators -----------------------------------------------------------------------
def test_grpo_hand_computed() -> None:
    # group 0: rewards 1, 0, 0.5 -> mean 0.5, population std sqrt(1/6) = 0.4082483; group 5: singleton
    b = make_batch([1.0, 0.0, 0.5, 2.0], [2, 3, 1, 4], [0, 0, 0, 5])
    adv = grpo_advantages(b, cfg(adv_eps=1e-6))
    a = 0.5 / (0.4082483 + 1e-6)  # 1.2247419
    expect(adv, [[a, a, 0, 0], [-a, -a, -a, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert adv.dtype == torch.float32


def test_dr_grpo_skips_std() -> None:
    b = make_batch([1.0, 0.0, 0.5, 2.0], [2, 3, 1, 4], [0, 0, 0, 5])
    expected = [[0.5, 0.5, 0, 0], [-0.5, -0.5, -0.5, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    expect(dr_grpo_advantages(b, cfg()), expected)
    expect(grpo_advantages(b, cfg(group_std_norm=False)), expected)


def test_rloo_leave_one_out() -> None:
    # baselines: (0 + .5)/2 = .25, (1 + .5)/2 = .75, (1 + 0)/2 = .5; singleton -> 0
    b = make_batch([1.0, 0.0, 0.5, 2.0], [2, 3, 1, 4], [0, 0, 0, 5])
    expect(rloo_advantages(b, cfg()), [[0.75, 0.75, 0, 0], [-0.75, -0.75, -0.75, 0], [0, 0, 0, 0], [0, 0, 0, 0]])


def test_all_equal_rewards_give_exactly_zero() -> None:
    b = make_batch([0.1, 0.1, 0.1, 0.7], [4, 2, 3, 1], [3, 3, 3, 4])
    for fn in (grpo_advantages, rloo_advantages, dr_grpo_advantages):
        adv = fn(b, cfg())
        assert torch.equal(adv, torch.zeros_like(adv)), fn.__name__


def test_zero_length_response_counts_in_group_but_gets_no_advantage() -> None:
    # row 1 generated nothing: advantage 0 there, but its reward 0 is part of the group mean 0.5
    b = make_batch([1.0, 0.0], [2, 0], [0, 0])
    adv = grpo_advantages(b, cfg(adv_eps=0.0))
    expect(adv, [[1, 1, 0, 0], [0, 0, 0, 0]])
    fully_masked = make_batch([1.0, 3.0], [0, 0], [0, 0])
    for fn in (grpo_advantages, rloo_advantages, reinforce_pp_advantages, reinforce_advantages):
        out = fn(fully_masked, cfg())
        assert torch.equal(out, torch.zeros_like(out)), fn.__name__


def test_turn_credit_counts_each_turn_once() -> None:
    # episode 0: turns with G = 0.5 (2 tokens) and 1.0 (1 token, after an env token);
    # episode 1: one turn, G = 0. Units 0.5, 1.0, 0.0 -> mean 0.5, std sqrt(1/6).
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)
    b = {
        "loss_mask": mask,
        "rewards": torch.tensor([0.5, 0.0]),
        "turn_returns": torch.tensor([[0.5, 0.5, 9.0, 1.0], [0.0, 0.0, 0.0, 0.0]]),
        "group_ids": torch.tensor([1, 1]),
    }
    expect(dr_grpo_advantages(b, cfg(credit="turn")), [[0, 0, 0, 0.5], [-0.5, 0, 0, 0]])
    a = 0.5 / 0.4082483
    expect(grpo_advantages(b, cfg(credit="turn", adv_eps=0.0)), [[0, 0, 0, a], [-a, 0, 0, 0]])
    # RLOO leaves out the whole episode: ep0 baseline 0 -> [.5, .5, 1]; ep1 baseline .75
    expect(rloo_advantages(b, cfg(credit="turn")), [[0.5, 0.5, 0, 1.0], [-0.75, 0, 0, 0]])
    with pytest.raises(ValueError, match="turn_returns"):
        grpo_advantages({k: v for k, v in b.items() if k != "turn_returns"}, cfg(credit="turn"))


# -- REINFORCE family -------------------------------------------------------------------------
def test_reinforce_pp_whitens_over_tokens() -> None:
    # token returns 1, 1 | 0: mean 2/3, std sqrt(2/9) -> 0.7071068, 0.7071068, -1.4142136
    b = make_batch([1.0, 0.0], [2, 1], [0, 1])
    expect(reinforce_pp_advantages(b, cfg(adv_eps=0.0)), [[0.7071068, 0.7071068, 0, 0], [-1.4142136, 0, 0, 0]])


def test_token_discount_skips_env_tokens() -> None:
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    b = {"loss_mask": mask, "rewards": torch.tensor([1.0]), "group_ids": torch.tensor([0])}
    expect(reinforce_advantages(b, cfg(token_discount=0.5)), [[0.25, 0.5, 0, 1.0]])


def test_kl_in_reward_is_reward_to_go() -> None:
    # k1 = logprobs - ref = 0.5, -0.5; kl_ctl 0.1 -> token rewards -0.05, 1 + 0.05
    b = make_batch([1.0], [2], [0])
    b["logprobs"] = torch.tensor([[-1.0, -2.0, 0.0, 0.0]])
    b["ref_logp"] = torch.tensor([[-1.5, -1.5, 0.0, 0.0]])
    c = cfg(kl_in_reward=True, kl_ctl=0.1, kl_estimator="k1")
    expect(reinforce_advantages(b, c), [[1.0, 1.05, 0, 0]])
    b["prox_logp"] = torch.tensor([[-1.5, -1.5, 0.0, 0.0]])  # policy side becomes prox: kl = 0
    expect(reinforce_advantages(b, c), [[1.0, 1.0, 0, 0]])
    # group estimators use the sequence's total: R - 0.1 * sum(kl) per unit
    two = make_batch([1.0, 1.0], [2, 1], [0, 0])
    two["logprobs"] = torch.tensor([[-1.0, -1.0, 0, 0], [-1.0, 0, 0, 0]])
    two["ref_logp"] = torch.tensor([[-2.0, -2.0, 0, 0], [-1.0, 0, 0, 0]])
    # row 0: kl 1, 1 -> scores 0.8, 0.9 (to-go); row 1: score 1; unit values 0.8, 1 -> mean 0.9
    expect(dr_grpo_advantages(two, c), [[-0.1, 0.0, 0, 0], [0.1, 0, 0, 0]])
    with pytest.raises(ValueError, match="ref_logp"):
        reinforce_advantages({k: v for k, v in b.items() if k != "ref_logp"}, c)


def test_rebn_standardises_episode_returns() -> None:
    # returns 1, 2, 3, 6: mean 3, std sqrt(3.5) = 1.8708287
    b = make_batch([1.0, 2.0, 3.0, 6.0], [1, 1, 1, 1], [0, 1, 2, 3])
    expect(
        reinforce_advantages(b, cfg(rebn=True, adv_eps=0.0)),
        [[-1.0690450, 0, 0, 0], [-0.5345225, 0, 0, 0], [0, 0, 0, 0], [1.6035675, 0, 0, 0]],
    )


# -- PPO / GAE --------------------------------------------------------------------------------
def test_gae_hand_computed() -> None:
    # V = .5, .6, .7, R = 1, token_discount 1, gae_lambda .5: deltas .1, .1, .3 -> A = .225, .25, .3
    b = make_batch([1.0], [3], [0])
    b["values"] = torch.tensor([[0.5, 0.6, 0.7, 0.0]])
    adv = gae_advantages(b, cfg(gae_lambda=0.5, adv_eps=0.0))
    assert "returns" not in b  # the batch is read, never written
    expect(gae_returns(b, cfg(gae_lambda=0.5, adv_eps=0.0)), [[0.725, 0.85, 1.0, 0.0]])
    expect(adv, [[-1.0690450, -0.2672612, 1.3363062, 0.0]])


def test_gae_discount_and_gaps() -> None:
    # tokens 0, 1, 3 generated (2 is an env token); token_discount .5, gae_lambda 1, V = 0 -> A = R * .5^k
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    b = {"loss_mask": mask, "rewards": torch.tensor([2.0]), "group_ids": torch.tensor([0]),
         "values": torch.tensor([[0.0, 0.0, float("nan"), 0.0]])}
    expect(gae_returns(b, cfg(token_discount=0.5, gae_lambda=1.0)), [[0.5, 1.0, 0.0, 2.0]])
    with pytest.raises(ValueError, match="credit='turn'"):
        gae_advantages(b, cfg(credit="turn"))
    with pytest.raises(ValueError, match="'values'"):
        gae_advantages({k: v for k, v in b.items() if k != "values"}, cfg())


# -- shaping ----------------------------------------------------------------------------------
def test_shaping_bias_scale_clip_no_eos() -> None:
    b = make_batch([3.0, -1.0, 0.5], [1, 1, 1], [0, 1, 2])
    b["no_eos"] = torch.tensor([False, False, True])
    shaped = shape_rewards(b, cfg(reward_bias=1.0, reward_scaling=2.0, reward_clip=5.0, mask_no_eos_with_zero=True))
    assert shaped.episode.tolist() == [5.0, 0.0, 0.0]
    shaped = shape_rewards(b, cfg(reward_bias=1.0, reward_scaling=2.0, reward_clip=5.0))
    assert shaped.episode.tolist() == [5.0, 0.0, 3.0]


def test_overlong_penalty() -> None:
    # L_max 10, window 4: free up to 6 tokens, linear to -factor at 10 and beyond
    c = cfg(overlong_tokens=4, overlong_penalty_factor=0.5, max_response_tokens=10)
    assert overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), c).tolist() == [0.0, 0.0, -0.25, -0.5, -0.5]
    b = make_batch([1.0, 1.0], [2, 4], [0, 1])
    b["response_lengths"] = torch.tensor([6, 9])
    assert shape_rewards(b, c).episode.tolist() == [1.0, 0.625]
    with pytest.raises(ValueError, match="max_response_tokens"):
        shape_rewards(b, cfg(overlong_tokens=4))


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_inputs_are_rejected(bad: float) -> None:
    b = make_batch([1.0, bad], [2, 1], [0, 0])
    with pytest.raises(ValueError, match=r"batch\['rewards'\] holds 1 NaN/inf"):
        grpo_advantages(b, cfg())
    b = make_batch([1.0, 0.0], [2, 1], [0, 0])
    b["values"] = torch.tensor([[0.0, bad, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"batch\['values'\] holds 1 NaN/inf value\(s\) inside loss_mask"):
        gae_advantages(b, cfg())
    b["values"] = torch.tensor([[0.0, 0, bad, 0], [0, bad, 0, 0]])  # outside the mask: ignored
    adv = gae_advantages(b, cfg())
    assert bool(torch.isfinite(adv).all()) and bool(torch.isfinite(gae_returns(b, cfg())).all())


def test_missing_and_misshaped_inputs_name_the_tensor() -> None:
    b = make_batch([1.0, 0.0], [2, 1], [0, 0])
    del b["group_ids"]
    with pytest.raises(ValueError, match="group_ids"):
        rloo_advantages(b, cfg())
    b = make_batch([1.0, 0.0], [2, 1], [0, 0])
    b["rewards"] = torch.ones(3)
    with pytest.raises(ValueError, match=r"batch\['rewards'\] must have shape \(2,\)"):
        grpo_advantages(b, cfg())


def test_large_batch_is_finite_and_centred() -> None:
    g = torch.Generator().manual_seed(0)
    n, groups, width = 64, 8, 16
    lengths = torch.randint(0, width + 1, (n,), generator=g).tolist()
    b = make_batch(torch.rand(n, generator=g).tolist(), lengths, [i % groups for i in range(n)], width)
    adv = grpo_advantages(b, cfg(group_std_norm=False))
    per_seq = b["rewards"].double() - torch.stack([b["rewards"][torch.arange(n) % groups == i % groups].double().mean()
                                                  for i in range(n)])
    first = adv[:, 0].double()
    has = torch.tensor(lengths) > 0
    assert math.isclose(float((first[has] - per_seq[has]).abs().max()), 0.0, abs_tol=1e-6)
