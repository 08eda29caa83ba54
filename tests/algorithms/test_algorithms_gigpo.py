"""GiGPO: the step-level advantage over step groups, and its sum with GRPO's, against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.advantages import gigpo_advantages, grpo_advantages, step_advantages
from areal_agents.config import AlgorithmConfig

S = math.sqrt(18.0)  # 1 / population std of {1/2, 0, 1/2}


def cfg(**kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(**{"use_decoupled_loss": False, "adv_eps": 0.0, **kw})  # type: ignore[arg-type]


def expect(adv: torch.Tensor, rows: list[list[float]]) -> None:
    torch.testing.assert_close(adv, torch.tensor(rows, dtype=adv.dtype), atol=1e-6, rtol=1e-6)


def three_episodes() -> dict[str, torch.Tensor]:
    """One prompt group, two turns per episode (``.`` prompt/env token, ``P``/``X``/``Y`` states).

    ep0: ``. P P . X .``  G = (0.5, 1.0), R = 0.5
    ep1: ``. P . X X .``  G = (0.0, 0.0), R = 0.0
    ep2: ``. P . Y . .``  G = (0.5, 1.0), R = 0.5   (Y: a state no other turn reached)
    Outside the mask the state ids hold X's id and the returns junk: neither may be read.
    """
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 1, 0, 1, 1, 0], [0, 1, 0, 1, 0, 0]], dtype=torch.bool)
    p, x, y = 4, 9, 2
    states = torch.tensor([[x, p, p, x, x, x], [x, p, x, x, x, x], [x, p, x, y, x, x]])
    returns = torch.tensor([[7.0, 0.5, 0.5, 7.0, 1.0, 7.0], [7.0, 0.0, 7.0, 0.0, 0.0, 7.0],
                            [7.0, 0.5, 7.0, 1.0, 7.0, 7.0]])
    return {"loss_mask": mask, "rewards": torch.tensor([0.5, 0.0, 0.5]), "group_ids": torch.tensor([3, 3, 3]),
            "turn_returns": returns, "state_ids": states}


def test_step_groups_shared_and_singleton_states() -> None:
    b = three_episodes()
    # P: G = .5, 0, .5 -> mean 1/3, std 1/sqrt(18); X: G = 1 (one token), 0 (two tokens) -> counted
    # once per turn: mean .5, std .5 (token-weighted it would be 1/3); Y: a step group of one -> 0.
    a, c = (0.5 - 1 / 3) * S, -(1 / 3) * S
    expect(step_advantages(b, cfg()), [[0, a, a, 0, 1, 0], [0, c, 0, -1, -1, 0], [0, a, 0, 0, 0, 0]])
    expect(step_advantages(b, cfg(group_std_norm=False)),
           [[0, 1 / 6, 1 / 6, 0, 0.5, 0], [0, -1 / 3, 0, -0.5, -0.5, 0], [0, 1 / 6, 0, 0, 0, 0]])
    # the episode part: R = .5, 0, .5 -> (.5 - 1/3) * S, -(1/3) * S on every generated token
    expect(gigpo_advantages(b, cfg()),
           [[0, 2 * a, 2 * a, 0, a + 1, 0], [0, 2 * c, 0, c - 1, c - 1, 0], [0, 2 * a, 0, a, 0, 0]])
    expect(gigpo_advantages(b, cfg(step_adv_weight=0.5)),
           [[0, 1.5 * a, 1.5 * a, 0, a + 0.5, 0], [0, 1.5 * c, 0, c - 0.5, c - 0.5, 0], [0, 1.5 * a, 0, a, 0, 0]])


def test_weight_zero_is_grpo_exactly_and_needs_no_state_ids() -> None:
    b = three_episodes()
    del b["state_ids"]
    for credit in ("trajectory", "turn"):
        for std_norm in (True, False):
            c = cfg(step_adv_weight=0.0, credit=credit, group_std_norm=std_norm, adv_eps=1e-6)
            gigpo, grpo = gigpo_advantages(b, c), grpo_advantages(b, c)
            assert torch.equal(gigpo, grpo) and gigpo.dtype == grpo.dtype
    with pytest.raises(ValueError, match="state_ids"):
        gigpo_advantages(b, cfg())


def test_equal_returns_in_a_step_group_give_zero() -> None:
    b = three_episodes()
    b["turn_returns"] = torch.where(b["loss_mask"], 0.1, 3.0)
    step = step_advantages(b, cfg(adv_eps=1e-6))
    assert torch.equal(step, torch.zeros_like(step))
    assert torch.equal(gigpo_advantages(b, cfg(adv_eps=1e-6)), grpo_advantages(b, cfg(adv_eps=1e-6)))


def test_same_state_in_another_prompt_group_is_another_step_group() -> None:
    # four one-turn episodes, all in state 0, two prompt groups: returns 1, 0 | 0.5, 0.5
    mask = torch.tensor([[0, 1, 1]] * 4, dtype=torch.bool)
    b = {"loss_mask": mask, "rewards": torch.tensor([1.0, 0.0, 0.5, 0.5]), "group_ids": torch.tensor([0, 0, 1, 1]),
         "turn_returns": torch.where(mask, torch.tensor([1.0, 0.0, 0.5, 0.5])[:, None], 0.0),
         "state_ids": torch.where(mask, 0, -1)}
    expect(step_advantages(b, cfg(group_std_norm=False)), [[0, 0.5, 0.5], [0, -0.5, -0.5], [0, 0, 0], [0, 0, 0]])
    # one turn per episode in one shared state: the step part repeats the episode part
    expect(gigpo_advantages(b, cfg()), [[0, 2, 2], [0, -2, -2], [0, 0, 0], [0, 0, 0]])


def test_adjacent_turns_with_equal_returns_are_told_apart_by_their_states() -> None:
    # no env token between the turns; ep0: state 0 (G 1, two tokens), state 1 (G 1);
    # ep1: state 0 (G 0), state 1 (G 1, two tokens). State 0: 1 vs 0; state 1: 1 vs 1.
    b = {"loss_mask": torch.ones(2, 3, dtype=torch.bool), "rewards": torch.tensor([1.0, 1.0]),
         "group_ids": torch.tensor([0, 0]), "turn_returns": torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]),
         "state_ids": torch.tensor([[0, 0, 1], [0, 1, 1]])}
    expect(step_advantages(b, cfg(group_std_norm=False)), [[0.5, 0.5, 0], [-0.5, 0, 0]])


def test_shaping_applies_to_turn_returns_and_rows_without_tokens_are_zero() -> None:
    b = three_episodes()
    plain = step_advantages(b, cfg(group_std_norm=False))
    torch.testing.assert_close(step_advantages(b, cfg(group_std_norm=False, reward_scaling=2.0)), 2 * plain)
    empty = {k: v[:, :1] for k, v in b.items() if v.dim() == 2} | {k: v for k, v in b.items() if v.dim() == 1}
    out = gigpo_advantages(empty, cfg())
    assert out.shape == (3, 1) and torch.equal(out, torch.zeros_like(out))


def test_bad_state_ids_name_the_tensor() -> None:
    b = three_episodes()
    b["state_ids"] = b["state_ids"][:, :3]
    with pytest.raises(ValueError, match=r"batch\['state_ids'\] must have the shape of loss_mask"):
        step_advantages(b, cfg())
