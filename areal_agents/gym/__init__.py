"""Registered envs as Gymnasium knows envs (no torch).

* :mod:`.registration` — :func:`make_env` (a registered env by name, as ``gymnasium.make``) and
  :func:`register_gymnasium_envs` (every registered env in Gymnasium's own registry);
* :mod:`.checker` — :func:`check_env`, the contract of a text env checked as Gymnasium's checker checks its own
  (with the replies :func:`probe_actions` takes from the env's action space).
"""

from __future__ import annotations

from areal_agents.gym.checker import EnvCheckError, EnvCheckWarning, check_env, probe_actions
from areal_agents.gym.registration import gymnasium_id, make_env, register_gymnasium_envs

__all__ = ["EnvCheckError", "EnvCheckWarning", "check_env", "gymnasium_id", "make_env", "probe_actions",
           "register_gymnasium_envs"]
