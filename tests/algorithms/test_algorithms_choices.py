"""One list per knob: each choice the config accepts is one the algorithms act on, and nothing else passes either."""

from __future__ import annotations

import pytest
import torch

from algorithms.advantages import grpo_advantages
from algorithms.functional import kl_estimate
from algorithms.importance import behav_importance_weights
from algorithms.losses import LossNorm, aggregate
from areal_agents.config import (
    CREDITS,
    IMP_WEIGHT_CORRECTIONS,
    IMP_WEIGHT_MODES,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    AlgorithmConfig,
    ConfigError,
)

MASK = torch.tensor([[True, True, False], [True, False, False]])


def accepted(**kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(**{"use_decoupled_loss": False, "recompute_logprob": True, **kw})  # type: ignore[arg-type]


def test_every_loss_aggregation_the_config_takes_is_one_the_loss_computes() -> None:
    x, norm = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]), LossNorm(tokens=3, seqs=2, max_len=4)
    seen = {mode: float(aggregate(x, MASK, accepted(loss_agg_mode=mode).loss_agg_mode, norm)) for mode in LOSS_AGG_MODES}
    assert seen == pytest.approx({"token-mean": 2.0, "seq-mean-token-mean": 2.25, "seq-mean-token-sum-norm": 0.75})
    with pytest.raises(ConfigError, match=f"must be one of {', '.join(LOSS_AGG_MODES)} "):
        accepted(loss_agg_mode="token-sum")
    with pytest.raises(ValueError, match=f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)} "):
        aggregate(x, MASK, "token-sum", norm)


def test_every_kl_estimator_the_config_takes_is_one_the_algorithms_compute() -> None:
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    for name in KL_ESTIMATORS:
        assert torch.isfinite(kl_estimate(logp, ref, accepted(kl_estimator=name).kl_estimator)).all()
    with pytest.raises(ConfigError, match=f"must be one of {', '.join(KL_ESTIMATORS)} "):
        accepted(kl_estimator="k4")
    with pytest.raises(ValueError, match=f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)} "):
        kl_estimate(logp, ref, "k4")


def test_every_importance_weight_mode_and_correction_the_config_takes_is_one_the_loss_applies() -> None:
    trainer, behav = torch.tensor([[-1.0, -0.1, 0.0], [-2.0, 0.0, 0.0]]), torch.full((2, 3), -1.0)
    for mode in ("auto", *IMP_WEIGHT_MODES):
        for correction in IMP_WEIGHT_CORRECTIONS:
            cfg = accepted(behav_imp_weight_mode=mode, behav_imp_weight_correction=correction)
            weights, _ = behav_importance_weights(trainer, behav, MASK, cfg.imp_weight_mode,
                                                  cfg.behav_imp_weight_correction, cfg.behav_imp_weight_cap)
            assert bool((weights[MASK] >= 0).all())
    assert accepted().imp_weight_mode in IMP_WEIGHT_MODES  # auto resolves to a mode the loss knows
    with pytest.raises(ConfigError, match=f"must be one of auto, {', '.join(IMP_WEIGHT_MODES)} "):
        accepted(behav_imp_weight_mode="per-turn")
    with pytest.raises(ValueError, match=f"must be one of {', '.join(IMP_WEIGHT_MODES)} "):
        behav_importance_weights(trainer, behav, MASK, "per-turn", "mask", 5.0)
    with pytest.raises(ConfigError, match=f"must be one of {', '.join(IMP_WEIGHT_CORRECTIONS)} "):
        accepted(behav_imp_weight_correction="clip")
    with pytest.raises(ValueError, match=f"must be one of {', '.join(IMP_WEIGHT_CORRECTIONS)} "):
        behav_importance_weights(trainer, behav, MASK, "token", "clip", 5.0)


def test_every_credit_the_config_takes_gives_its_own_advantages() -> None:
    # one group of two 2-turn episodes: returns 1 and 0, but the first turn of each carries the other's sign
    batch = {
        "loss_mask": torch.tensor([[True, False, True], [True, False, True]]),
        "rewards": torch.tensor([1.0, 0.0]),
        "turn_returns": torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]),
        "group_ids": torch.tensor([0, 0]),
        "logprobs": torch.full((2, 3), -1.0),
        "no_eos": torch.zeros(2, dtype=torch.bool),
        "response_lengths": torch.tensor([2, 2]),
    }
    expected = {"trajectory": [[1.0, 0.0, 1.0], [-1.0, 0.0, -1.0]], "turn": [[-1.0, 0.0, 1.0], [1.0, 0.0, -1.0]]}
    assert set(expected) == set(CREDITS)  # a credit added to the config needs its advantages here
    for credit, rows in expected.items():
        adv = grpo_advantages(batch, accepted(credit=credit, adv_eps=0.0))
        torch.testing.assert_close(adv, torch.tensor(rows))
    with pytest.raises(ConfigError, match=f"must be one of {', '.join(CREDITS)} "):
        accepted(credit="step")
