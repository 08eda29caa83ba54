"""Experiment configuration: dataclasses with one help line per field (no torch).

* :mod:`.fields` — ``f(default, help, rule)``, the rules, :class:`Section` and :class:`ConfigError`;
* :mod:`.vocabulary` — the closed choice lists (dtypes, loss aggregation, KL estimators, ...), shared with the
  code that acts on them, and the renamed keys;
* :mod:`.sections` — the sections (``env``, ``agent``, ``data``, ``sampling``, ``inference``, ``rollout``, ...);
* :mod:`.experiment` — :class:`ExperimentConfig`, every section in one, with the rules that span sections;
* :mod:`.loader` — YAML plus ``key=value`` overrides into an :class:`ExperimentConfig` (OmegaConf), and back;
* :mod:`.doc` — the config reference page, rendered from the fields' help.
"""

from __future__ import annotations

from areal_agents.config.experiment import ExperimentConfig
from areal_agents.config.fields import (
    ConfigError,
    Rule,
    Section,
    ge,
    gt,
    one_of,
    within,
)
from areal_agents.config.reward_sections import JudgeConfig, RewardModelConfig
from areal_agents.config.sections import (
    ActorConfig,
    AgentConfig,
    AlgorithmConfig,
    DataConfig,
    EnvConfig,
    EvalConfig,
    InferenceConfig,
    LoggingConfig,
    LoraConfig,
    OnlineConfig,
    RayConfig,
    RolloutConfig,
    SamplingConfig,
    SFTConfig,
    SGLangConfig,
    TrainerConfig,
)
from areal_agents.config.vocabulary import (
    CREDITS,
    DTYPES,
    IMP_WEIGHT_CORRECTIONS,
    IMP_WEIGHT_MODES,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    RENAMED_KEYS,
)

__all__ = [
    "CREDITS",
    "DTYPES",
    "IMP_WEIGHT_CORRECTIONS",
    "IMP_WEIGHT_MODES",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "RENAMED_KEYS",
    "ActorConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "ExperimentConfig",
    "InferenceConfig",
    "LoggingConfig",
    "JudgeConfig",
    "LoraConfig",
    "OnlineConfig",
    "RayConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "Rule",
    "SFTConfig",
    "SGLangConfig",
    "SamplingConfig",
    "Section",
    "TrainerConfig",
    "ge",
    "gt",
    "one_of",
    "within",
]
