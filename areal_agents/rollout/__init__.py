"""Rollout: agent episodes run concurrently under a staleness bound, handed to the trainer in groups.

- :mod:`~areal_agents.rollout.interface` — :class:`Rollout`, the protocol the trainer holds;
- :mod:`~areal_agents.rollout.executor` — :class:`RolloutExecutor`, the asynchronous executor
  (:mod:`~areal_agents.rollout.process`: the same in a child process);
- :mod:`~areal_agents.rollout.staleness` — the capacity/staleness rule it launches by;
- :mod:`~areal_agents.rollout.groups` — dataset feeding, episode groups, filters and counters;
- :mod:`~areal_agents.rollout.episode` — one episode: ``EpisodeFn``, :func:`make_episode_fn`,
  its deadline, its outcome;
- :mod:`~areal_agents.rollout.wiring` — an episode's pieces built from config (env, agent, sampling, the
  inference client, the run's reward runner handed to the envs);
- :mod:`~areal_agents.rollout.evaluation` — greedy accuracy and pass@k;
- :mod:`~areal_agents.rollout.preflight` — :func:`preflight`, the user's env, reward and agent
  played once against a scripted model before a run builds anything;
- :mod:`~areal_agents.rollout.returns` — :func:`settle_returns`, the one owner of the return.
"""

from __future__ import annotations

from areal_agents.failures import EpisodesFailed
from areal_agents.rollout.episode import EpisodeFn, make_episode_fn
from areal_agents.rollout.executor import RolloutExecutor
from areal_agents.rollout.interface import Rollout
from areal_agents.rollout.returns import settle_returns

__all__ = ["EpisodeFn", "EpisodesFailed", "Rollout", "RolloutExecutor", "make_episode_fn", "settle_returns"]
