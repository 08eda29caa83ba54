"""Registered envs made by name (:func:`make_env`), and put in Gymnasium's own registry as ``areal_agents/<name>-v0``.

Nothing is registered on import (installed Gymnasium 1.x has no plugin entry points): call
:func:`register_gymnasium_envs` once, then ``gymnasium.make("areal_agents/math-v0")`` builds the
env through :func:`make_env` (``gymnasium.make`` keyword arguments go to its
constructor) and wraps it the way Gymnasium wraps any env.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium
from gymnasium.envs.registration import parse_env_id

from areal_agents.env import Env, RewardMixin
from areal_agents.registry import envs

if TYPE_CHECKING:
    from areal_agents.rewards import RewardRunner

__all__ = ["NAMESPACE", "VERSION", "GymnasiumEnvCreator", "gymnasium_id", "make_env", "register_gymnasium_envs"]

NAMESPACE = "areal_agents"
VERSION = 0


def make_env(name: str, *, reward_runner: RewardRunner | None = None, **kwargs: Any) -> Env:
    """Construct the env registered as ``name`` with ``kwargs`` (e.g. ``cfg.env.kwargs``); its
    :meth:`~areal_agents.env.RewardMixin.compute_reward` calls go to ``reward_runner`` when one is given."""
    factory = envs.get(name)
    try:
        env = factory(**kwargs)
    except TypeError as exc:
        raise TypeError(f"env {name!r}: bad constructor arguments {sorted(kwargs)}: {exc}") from None
    if not isinstance(env, Env):
        raise TypeError(f"env {name!r} built a {type(env).__name__}, which is not an areal_agents.Env subclass")
    if reward_runner is not None and isinstance(env, RewardMixin):
        env.reward_runner = reward_runner
    return env


def gymnasium_id(name: str, namespace: str = NAMESPACE) -> str:
    """The Gymnasium id of the env registered as ``name``: ``<namespace>/<name>-v0``."""
    env_id = f"{namespace}/{name}-v{VERSION}"
    try:
        parsed = parse_env_id(env_id)
    except gymnasium.error.Error:
        parsed = None
    if parsed != (namespace, name, VERSION):
        raise ValueError(f"env {name!r} (namespace {namespace!r}) does not make a Gymnasium id: "
                         "a name and namespace may hold only letters, digits, '_', '-', '.'")
    return env_id


@dataclass(frozen=True)
class GymnasiumEnvCreator:
    """Gymnasium's entry point for one registered env: ``creator(**kwargs)`` is ``make_env(name, **kwargs)``.

    Being a value (equal for the same name), registering the same env twice is a no-op.
    """

    name: str

    def __call__(self, **kwargs: Any) -> Env:
        return make_env(self.name, **kwargs)

    @property
    def metadata(self) -> dict[str, Any]:
        """The env class's ``metadata`` (what ``gymnasium.make`` checks ``render_mode`` against)."""
        metadata = getattr(envs.get(self.name), "metadata", None)
        return metadata if isinstance(metadata, dict) else {"render_modes": []}


def register_gymnasium_envs(names: Iterable[str] | None = None, *, namespace: str = NAMESPACE) -> list[str]:
    """Register the envs ``names`` (default: every registered env, built-ins included) in
    Gymnasium's registry as ``<namespace>/<name>-v0`` and return their ids. Safe to call again:
    an id already registered for the same env is left as it is."""
    ids = []
    for name in sorted(envs.names() if names is None else names):
        if name not in envs:
            raise ValueError(f"register_gymnasium_envs: unknown env {name!r}; registered: {', '.join(envs.names())}")
        env_id = gymnasium_id(name, namespace)
        creator = GymnasiumEnvCreator(name)
        known = gymnasium.registry.get(env_id)
        if known is None or known.entry_point != creator:
            gymnasium.register(id=env_id, entry_point=creator)
        ids.append(env_id)
    return ids
