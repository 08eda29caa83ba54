"""The config sections of rewards from models: the judge model a run serves, and ``areal-agents rm``."""

from __future__ import annotations

from dataclasses import dataclass

from areal_agents.config.fields import Section, f, ge, gt

__all__ = ["JudgeConfig", "RewardModelConfig"]


@dataclass
class JudgeConfig(Section):
    """A judge model the run serves for rewards read from a model's reply (docs/rewards.md, "Rewards from models")."""

    model_path: str | None = f(None, "Model directory to serve for judges: a server of its own on inference.backend, "
                                     "frozen (never sent the policy's weights); its OpenAI base URL is "
                                     "$AREAL_AGENTS_JUDGE_URL, where a Judge reward asks by default. A reward "
                                     "model (a sequence-classification model dir) is served for /classify, where a "
                                     "RewardModel reward asks.")


@dataclass
class RewardModelConfig(Section):
    """`areal-agents rm`: a reward model trained on preference pairs (docs/rewards.md, "Reward models")."""

    steps: int | None = f(None, "Optimiser steps (Bradley-Terry loss); None: one pass over the training pairs "
                                "(more passes overfit: held-out accuracy falls while the loss does).", ge(1))
    batch_size: int = f(32, "Preference pairs per step.", ge(1))
    lr: float = f(1e-3, "Learning rate (AdamW, linear warmup over the first tenth of the steps): 1e-3 suits the "
                        "tiny model, ~1e-5 a model of billions of parameters.", gt(0))
    eval_every: int = f(100, "Pairwise accuracy on held-out pairs (the test split) every N steps and at the end; "
                             "0: at the end only.", ge(0))
    eval_pairs: int = f(200, "Held-out pairs that accuracy is measured on.", ge(1))
    output_dir: str | None = f(None, "Where to write the model; None: <run_dir>/reward_model.")
