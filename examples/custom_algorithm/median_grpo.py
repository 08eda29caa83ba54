"""A new advantage estimator, registered and trained from this one file: GRPO with a median baseline.

    python examples/custom_algorithm/median_grpo.py --config examples/custom_algorithm/config.yaml [key=value ...]

``A_i = (R_i - median_g R) / (MAD_g + adv_eps)``, where ``median_g`` and ``MAD_g`` (mean
absolute deviation from the median) are taken over the episodes of the same prompt. The
median is a baseline that one lucky or broken episode cannot move, unlike GRPO's mean. The
spec pairs it with the built-in PPO-clip loss and sets its own defaults; the script registers
it as ``median-grpo`` and then runs ``areal-agents run`` with the command-line arguments.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from algorithms.functional import get_mask, group_index, require
from algorithms.shaping import shape_rewards
from algorithms.specs import AlgorithmSpec
from areal_agents.config import AlgorithmConfig

__all__ = ["MEDIAN_GRPO", "main", "median_advantages", "register"]


def median_advantages(batch: dict[str, Tensor], cfg: AlgorithmConfig) -> Tensor:
    """``(R_i - median_g) / (MAD_g + adv_eps)`` on every generated token; ``[B, T]``.

    Reads ``batch["loss_mask"]`` ``[B, T]``, ``batch["rewards"]`` ``[B]`` (shaped by the usual
    ``reward_*`` / overlong / ReBN settings) and ``batch["group_ids"]`` ``[B]``. The median of
    an even-sized group is the mean of its two middle values. A group whose rewards are all
    equal gets zero advantage. Only ``credit=trajectory``: turn credit is rejected.
    """
    if cfg.credit != "trajectory":
        raise ValueError(f"median-grpo supports algorithm.credit=trajectory only (got {cfg.credit!r})")
    mask = get_mask(batch)
    returns = shape_rewards(batch, cfg).episode  # [B] float64
    groups, num_groups = group_index(require(batch, "group_ids", "median-grpo"))
    adv = torch.zeros_like(returns)
    for g in range(num_groups):
        members = (groups == g).nonzero(as_tuple=True)[0]
        values = returns[members]
        median = values.quantile(0.5)  # linear interpolation: the mean of the middle two when even
        mad = (values - median).abs().mean()
        adv[members] = (values - median) / (mad + cfg.adv_eps)
    out = torch.where(mask, adv[:, None].expand_as(mask), torch.zeros((), dtype=adv.dtype))
    return out.to(torch.promote_types(batch["rewards"].dtype, torch.float32))


MEDIAN_GRPO = AlgorithmSpec(
    name="median-grpo",
    advantage=median_advantages,
    loss="algorithms.losses:ppo_loss",
    defaults={"use_decoupled_loss": False, "recompute_logprob": False, "loss_agg_mode": "token-mean",
              "eps_clip": 0.2},
    description="GRPO with a median baseline and mean-absolute-deviation scale per group.",
    formula="A_i = (R_i - median_g R) / (mean_g |R - median_g R| + eps)",
)


def register() -> None:
    """Register :data:`MEDIAN_GRPO` as ``median-grpo`` (``algorithm.name=median-grpo``)."""
    from areal_agents import register_algorithm

    register_algorithm("median-grpo")(MEDIAN_GRPO)


def main(argv: list[str] | None = None) -> int:
    """Register the algorithm, then ``areal-agents run`` with ``argv`` (default: the command line)."""
    from areal_agents.cli import main as cli_main

    register()
    return cli_main(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
