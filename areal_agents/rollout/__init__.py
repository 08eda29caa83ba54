"""Rollout: agent episodes run concurrently under a staleness bound, handed to the trainer in groups.

- :mod:`~areal_agents.rollout.executor` — :class:`RolloutExecutor`, the asynchronous executor;
- :mod:`~areal_agents.rollout.staleness` — the capacity/staleness rule it launches by;
- :mod:`~areal_agents.rollout.groups` — dataset feeding, episode groups, filters and counters;
- :mod:`~areal_agents.rollout.episode` — one episode: ``EpisodeFn``, :func:`make_episode_fn`,
  its deadline, its outcome, and its wiring from config (plus evaluation).
"""

from __future__ import annotations

from areal_agents.failures import EpisodesFailed
from areal_agents.rollout.episode import EpisodeFn, make_episode_fn
from areal_agents.rollout.executor import RolloutExecutor

__all__ = ["EpisodeFn", "EpisodesFailed", "RolloutExecutor", "make_episode_fn"]
