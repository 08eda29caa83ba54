"""The config's vocabulary, each word written once: the closed choice lists, and the keys that were renamed.

A section's field validates against one of the choice lists (``one_of(*LOSS_AGG_MODES)``) and the
code that acts on the value (the ``algorithms`` package, the trainer, the weight endpoints) imports
the same tuple, so a choice added or renamed here reaches both. Open sets that users extend (env,
agent, algorithm names) live in :mod:`areal_agents.registry` instead. :data:`RENAMED_KEYS` is what
the loader answers a key that is no longer there with.
"""

from __future__ import annotations

__all__ = ["CREDITS", "DTYPES", "IMP_WEIGHT_CORRECTIONS", "IMP_WEIGHT_MODES", "KL_ESTIMATORS", "LOSS_AGG_MODES",
           "RENAMED_KEYS"]

DTYPES = ("float32", "bfloat16", "float16")
"""Parameter, compute and reduction dtypes (``actor.dtype``, ``sglang.dtype``, weight-sync payloads)."""

KL_ESTIMATORS = ("k1", "k2", "k3")
"""``algorithm.kl_estimator``: the per-token estimators of KL(pi || pi_ref)."""

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""``algorithm.loss_agg_mode``: how token losses are averaged over a batch."""

CREDITS = ("trajectory", "turn")
"""``algorithm.credit``: one return per episode, or one per turn."""

IMP_WEIGHT_MODES = ("none", "token", "sequence")
"""The behaviour importance weight the loss applies; ``algorithm.behav_imp_weight_mode`` also takes
``auto``, which resolves to one of these (``AlgorithmConfig.imp_weight_mode``)."""

IMP_WEIGHT_CORRECTIONS = ("mask", "truncate")
"""``algorithm.behav_imp_weight_correction``: what happens to a weight above the cap."""

RENAMED_KEYS: dict[str, str] = {
    "algorithm.behave_imp_weight_mode": "algorithm.behav_imp_weight_mode",
    "algorithm.behave_imp_weight_correction": "algorithm.behav_imp_weight_correction",
    "algorithm.gamma": "algorithm.token_discount",
    "algorithm.lam": "algorithm.gae_lambda",
}
"""Old dotted key -> its new name: a YAML file or an override that still sets the old key fails with
``OLD: renamed to NEW`` (the loader's key check), and an algorithm spec's ``defaults`` say so too."""
