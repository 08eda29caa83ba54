"""Named RL algorithms: an advantage estimator + a loss + config defaults.

This module does not import torch: the config loader imports it to read ``defaults``, and
the estimator and loss are referred to by lazy ``"module:attr"`` strings that load on first
use. ``defaults`` are :class:`~areal_agents.config.AlgorithmConfig` field values applied
*under* the user's YAML and overrides. The built-ins are registered through the
``areal_agents.algorithms`` entry points; a user adds one with::

    from areal_agents import register_algorithm
    from algorithms.specs import AlgorithmSpec

    register_algorithm("my-algo")(AlgorithmSpec(
        name="my-algo", advantage="algorithms.advantages:reinforce_advantages",
        loss="algorithms.losses:ppo_loss", defaults={"rebn": True}))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from areal_agents.config import RENAMED_KEYS, AlgorithmConfig
from areal_agents.registry import load_object

if TYPE_CHECKING:
    from torch import Tensor

    from algorithms.losses import LossNorm

__all__ = [
    "DAPO",
    "DECOUPLED_PPO",
    "DR_GRPO",
    "GIGPO",
    "GRPO",
    "PPO",
    "REINFORCE_PP",
    "RLOO",
    "AdvantageFn",
    "AlgorithmSpec",
    "LossFn",
    "get_algorithm",
]

_FIELDS = {f.name for f in dataclasses.fields(AlgorithmConfig)}


class AdvantageFn(Protocol):
    """An advantage estimator, or a critic's value targets: ``fn(batch, cfg)``, ``batch`` the
    collated tensors (``[B, T]`` per token, ``[B]`` per sequence) → ``[B, T]``."""

    def __call__(self, batch: Mapping[str, Tensor], cfg: AlgorithmConfig, /) -> Tensor: ...


class LossFn(Protocol):
    """A loss: ``fn(logp, batch, cfg, norm, *, entropy=None, values=None) -> (loss, metrics)``.

    ``logp`` ``[B, T]`` the current logprobs (with grad), ``batch`` the micro-batch, ``norm``
    the whole batch's denominators, ``entropy`` / ``values`` ``[B, T]`` token entropies and
    critic estimates; ``loss`` a scalar, ``metrics`` numbers (floats or scalar tensors) that sum
    over micro-batches (see :mod:`algorithms.losses`).
    """

    def __call__(self, logp: Tensor, batch: Mapping[str, Tensor], cfg: AlgorithmConfig, norm: LossNorm, /, *,
                 entropy: Tensor | None = None,
                 values: Tensor | None = None) -> tuple[Tensor, Mapping[str, float | Tensor]]: ...


def _label(obj: object) -> str:
    if isinstance(obj, str):
        return obj
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


@dataclass(frozen=True, repr=False)
class AlgorithmSpec:
    """One named algorithm.

    ``advantage``: ``fn(batch, cfg) -> [B, T]`` (or its ``"module:attr"`` string);
    ``loss``: ``fn(logp, batch, cfg, norm, *, entropy=None, values=None) -> (loss, metrics)``;
    ``defaults``: AlgorithmConfig overrides; ``needs_critic``: the trainer builds a value
    model, and ``value_targets`` ``fn(batch, cfg) -> [B, T]`` gives the critic's regression
    targets ``batch["returns"]`` (default with a critic: GAE's, ``A + V``). What a training step
    computes before the loss is read from here by the recipe (:func:`trainers.loop.train_step`):
    reference logprobs when :meth:`needs_reference`, proximal ones when :meth:`needs_proximal`,
    values and targets when ``needs_critic``.
    """

    name: str
    advantage: str | AdvantageFn
    loss: str | LossFn = "algorithms.losses:ppo_loss"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    needs_critic: bool = False
    description: str = ""
    formula: str = ""
    value_targets: str | AdvantageFn | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.defaults) - _FIELDS)
        if unknown:
            renamed = [f"{key}: renamed to {RENAMED_KEYS[f'algorithm.{key}'].removeprefix('algorithm.')}"
                       for key in unknown if f"algorithm.{key}" in RENAMED_KEYS]
            hint = f" ({'; '.join(renamed)})" if renamed else ""
            raise ValueError(f"algorithm {self.name!r}: defaults has unknown AlgorithmConfig field(s) {unknown}{hint}")
        if "name" in self.defaults:
            raise ValueError(f"algorithm {self.name!r}: defaults must not set 'name'")
        if self.needs_critic and self.value_targets is None:  # frozen: set through object
            object.__setattr__(self, "value_targets", "algorithms.advantages:gae_returns")
        for what in ("advantage", "loss", *(("value_targets",) if self.value_targets is not None else ())):
            obj = getattr(self, what)
            if isinstance(obj, str) and ":" not in obj:
                raise ValueError(f"algorithm {self.name!r}: {what} {obj!r} must be a callable or 'module:attr'")
            if not isinstance(obj, str) and not callable(obj):
                raise ValueError(f"algorithm {self.name!r}: {what} must be a callable or 'module:attr'")

    def __repr__(self) -> str:
        return f"AlgorithmSpec({self.name!r}, advantage={_label(self.advantage)}, loss={_label(self.loss)})"

    def _resolve(self, what: str) -> Callable[..., object]:
        """The callable ``what`` names, imported on first use. Only its callability is checked
        here: its signature is the protocol's (:class:`AdvantageFn`, :class:`LossFn`) by contract."""
        obj = getattr(self, what)
        fn: object = load_object(obj) if isinstance(obj, str) else obj
        if not callable(fn):
            raise TypeError(f"algorithm {self.name!r}: {what} {_label(obj)} is not callable")
        return fn

    def advantage_fn(self) -> AdvantageFn:
        """The advantage estimator ``fn(batch, cfg) -> Tensor [B, T]`` (imported on first use)."""
        return cast("AdvantageFn", self._resolve("advantage"))

    def loss_fn(self) -> LossFn:
        """The loss ``fn(logp, batch, cfg, norm, *, entropy=None, values=None)``."""
        return cast("LossFn", self._resolve("loss"))

    def value_targets_fn(self) -> AdvantageFn:
        """The critic's targets ``fn(batch, cfg) -> Tensor [B, T]`` (an algorithm with a critic)."""
        if self.value_targets is None:
            raise ValueError(f"algorithm {self.name!r} has no critic, so no value targets")
        return cast("AdvantageFn", self._resolve("value_targets"))

    def needs_reference(self, cfg: AlgorithmConfig) -> bool:
        """Whether a frozen reference model is needed: ``kl_ctl > 0``."""
        return cfg.kl_ctl > 0

    def needs_proximal(self, cfg: AlgorithmConfig) -> bool:
        """Whether the loss takes proximal logprobs ``prox_logp`` (the policy's before the step):
        ``use_decoupled_loss`` or ``recompute_logprob``."""
        return cfg.use_decoupled_loss or cfg.recompute_logprob


def get_algorithm(name: str) -> AlgorithmSpec:
    """The registered :class:`AlgorithmSpec` called ``name`` (``areal-agents list algorithms``)."""
    from areal_agents.registry import algorithms

    spec = algorithms.get(name)
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"algorithm {name!r} is registered as {type(spec).__name__}, not an AlgorithmSpec")
    return spec


_PLAIN = {"use_decoupled_loss": False, "recompute_logprob": False}
_ADV = "algorithms.advantages:"

GRPO = AlgorithmSpec(
    name="grpo",
    advantage=_ADV + "grpo_advantages",
    defaults={**_PLAIN, "group_std_norm": True, "loss_agg_mode": "seq-mean-token-mean"},
    description="Group-relative policy optimisation: group-normalised rewards, PPO clip.",
    formula="A_i = (R_i - mean_g R) / (std_g R + eps)",
)
GIGPO = AlgorithmSpec(
    name="gigpo",
    advantage=_ADV + "gigpo_advantages",
    defaults={**_PLAIN, "group_std_norm": True, "loss_agg_mode": "seq-mean-token-mean"},
    description="GRPO's episode advantage plus a step-level one: each turn's return against the group's turns "
                "from the same env state (algorithm.step_adv_weight).",
    formula="A = (R - mean_g R) / (std_g R + eps) + w (G_t - mean_s G) / (std_s G + eps), s = turns of g in t's state",
)
DR_GRPO = AlgorithmSpec(
    name="dr-grpo",
    advantage=_ADV + "dr_grpo_advantages",
    defaults={**_PLAIN, "group_std_norm": False, "loss_agg_mode": "seq-mean-token-sum-norm"},
    description="GRPO done right: no std division, token sums over a fixed length.",
    formula="A_i = R_i - mean_g R; loss = mean_i sum_t l_it / L_max",
)
DAPO = AlgorithmSpec(
    name="dapo",
    advantage=_ADV + "grpo_advantages",
    defaults={
        **_PLAIN,
        "eps_clip": 0.2,
        "eps_clip_high": 0.28,
        "loss_agg_mode": "token-mean",
        "group_std_norm": True,
        "overlong_tokens": 256,
        "overlong_penalty_factor": 1.0,
        "kl_ctl": 0.0,
    },
    description="Clip-higher, token-level loss, soft overlong penalty (dynamic sampling: rollout.group_filter=nonzero_std).",
    formula="A_i = (R_i + P_len(|y_i|) - mean_g) / (std_g + eps); clip(r, 1-0.2, 1+0.28)",
)
RLOO = AlgorithmSpec(
    name="rloo",
    advantage=_ADV + "rloo_advantages",
    defaults={**_PLAIN, "loss_agg_mode": "token-mean"},
    description="REINFORCE leave-one-out: baseline is the mean of the other samples of the prompt.",
    formula="A_i = R_i - (sum_{j != i} R_j) / (n - 1)",
)
REINFORCE_PP = AlgorithmSpec(
    name="reinforce++",
    advantage=_ADV + "reinforce_pp_advantages",
    defaults={**_PLAIN, "kl_in_reward": True, "loss_agg_mode": "token-mean"},
    description="REINFORCE++: token returns with an optional KL reward, whitened over the batch.",
    formula="G_t = sum_{s>=t} d^(s-t) (R 1[s=last] - beta kl_s), d = token_discount; A = whiten_batch(G)",
)
PPO = AlgorithmSpec(
    name="ppo",
    advantage=_ADV + "gae_advantages",
    defaults={**_PLAIN, "token_discount": 1.0, "gae_lambda": 0.95, "loss_agg_mode": "token-mean"},
    needs_critic=True,
    description="PPO with a critic: GAE advantages, clipped surrogate and clipped value loss.",
    formula="A_t = sum_l (d lam)^l delta_{t+l}, delta_t = r_t + d V_{t+1} - V_t (d = token_discount, lam = gae_lambda)",
)
DECOUPLED_PPO = AlgorithmSpec(
    name="decoupled-ppo",
    advantage=_ADV + "grpo_advantages",
    defaults={"use_decoupled_loss": True, "recompute_logprob": True, "loss_agg_mode": "token-mean"},
    description="AReaL's asynchronous PPO: group advantages, ratio to proximal logprobs times a capped behaviour weight.",
    formula="l_t = w_t max(-A r_t, -A clip(r_t)), r_t = pi/pi_prox, w_t = pi_prox/pi_behav (0 if > cap)",
)
