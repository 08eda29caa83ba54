"""areal-agents: asynchronous reinforcement learning for LLM agents.

The public API is importable from here; heavier pieces load on first use so that
``import areal_agents`` stays light and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.config.loader import load_config
from areal_agents.registry import (
    Registry,
    register_agent,
    register_algorithm,
    register_dataset,
    register_env,
    register_reward,
)
from areal_agents.types import Trajectory

__version__ = "0.1.0"

_LAZY = {
    **dict.fromkeys(("DatasetMixin", "Env", "ReferenceMixin", "RewardMixin"), "areal_agents.env"),
    **dict.fromkeys(("EnvCheckError", "EnvCheckWarning", "check_env"), "areal_agents.gym.checker"),
    **dict.fromkeys(("make_env", "register_gymnasium_envs"), "areal_agents.gym.registration"),
    **dict.fromkeys(("Agent", "ChatAgent", "checked_step"), "areal_agents.agent"),
}

if TYPE_CHECKING:
    from areal_agents.agent import Agent, ChatAgent, checked_step
    from areal_agents.env import DatasetMixin, Env, ReferenceMixin, RewardMixin
    from areal_agents.gym.checker import EnvCheckError, EnvCheckWarning, check_env
    from areal_agents.gym.registration import make_env, register_gymnasium_envs

__all__ = [
    "Agent",
    "ChatAgent",
    "ConfigError",
    "DatasetMixin",
    "Env",
    "EnvCheckError",
    "EnvCheckWarning",
    "ExperimentConfig",
    "ReferenceMixin",
    "Registry",
    "RewardMixin",
    "Trajectory",
    "check_env",
    "checked_step",
    "load_config",
    "make_env",
    "register_agent",
    "register_algorithm",
    "register_dataset",
    "register_env",
    "register_gymnasium_envs",
    "register_reward",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'areal_agents' has no attribute {name!r}")
