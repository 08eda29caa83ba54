"""The one owner of an episode's return (no torch).

Agents report what each turn earned, ``Trajectory.turn_rewards`` (with ``Trajectory.set_rewards``,
which leaves the return unset); the rollout turns them into the episode's ``reward`` and per-turn
``turn_returns`` with :func:`settle_returns` where the episode ends
(:func:`~areal_agents.rollout.episode.episode_outcome` for the executor, and
:func:`~areal_agents.rollout.evaluation.evaluate`). It applies the run's turn discount γ and the
failure policy, so an agent never hears of γ, one that only records rewards gets the same returns
as the built-in ones, and one that computed its own is overruled. γ is the config's
``env.turn_discount``, checked once there (γ ∈ (0, 1]); the rollout hands it here as it is:

- ``reward = Σ_k γ^k r_k`` and ``turn_returns[t] = Σ_{k≥t} γ^(k−t) r_k`` over the turns of the
  trajectory and of each of its ``segments``;
- a segment whose last turn comes before the episode's last one (an OpenAI-style agent's call
  whose prompt did not extend the episode's tokens; each trajectory's ``info["calls"]`` lists the
  indices of the episode's calls it holds) has its last reward discounted by the ``d`` calls
  after it: ``γ^d · r`` (unless its ``info["rewards_per_call"]`` says its rewards were earned at its
  own calls: an online session rewarded call by call, :mod:`areal_agents.online.sessions`);
- with ``zero_failed``, an episode whose status is not ``ok`` gets reward 0 on every turn
  (``rollout.failure_policy=zero`` keeps it in its group that way, so the trainer can mask it);
- a trajectory without ``turn_rewards`` keeps the ``reward`` its agent set (0 when failed under
  ``zero_failed``).

Settling is idempotent: it reads only ``turn_rewards``, never a return computed before.
"""

from __future__ import annotations

from collections.abc import Sequence

from areal_agents.types import Trajectory

__all__ = ["settle_returns"]


def _discounted(turn_rewards: Sequence[float], gamma: float) -> tuple[float, list[float]]:
    """Episode return ``Σ_k γ^k r_k`` and per-turn returns ``G_t = r_t + γ·G_(t+1)``.

    >>> _discounted([0.0, 1.0], 0.5)
    (0.5, [0.5, 1.0])
    """
    returns: list[float] = []
    later = 0.0
    for r in reversed(turn_rewards):
        later = float(r) + gamma * later
        returns.append(later)
    returns.reverse()
    return (returns[0] if returns else 0.0), returns


def _calls_after(parts: list[Trajectory]) -> list[int]:
    """For each part, how many of the episode's calls come after its last one (0 when unknown)."""
    calls: list[list[int]] = []
    for part in parts:
        held = part.info.get("calls") if isinstance(part.info, dict) else None
        if len(parts) < 2 or not isinstance(held, list) or not held or part.info.get("rewards_per_call"):
            return [0] * len(parts)
        calls.append(held)
    every = [i for held in calls for i in held]
    return [sum(i > held[-1] for i in every) for held in calls]


def settle_returns(traj: Trajectory, turn_discount: float = 1.0, *, zero_failed: bool = False) -> Trajectory:
    """Derive ``traj``'s ``reward`` and ``turn_returns`` (and its segments') from their
    ``turn_rewards`` with γ = ``turn_discount`` (see the module docstring); returns ``traj``,
    changed in place."""
    gamma = turn_discount
    zero = zero_failed and not traj.ok
    parts = [traj, *traj.segments]
    for part, later in zip(parts, _calls_after(parts), strict=True):
        if zero:
            part.reward, part.turn_returns = 0.0, [0.0] * len(part.turn_rewards)
            part.turn_rewards = [0.0] * len(part.turn_rewards)
        elif part.turn_rewards:
            earned = [float(r) for r in part.turn_rewards]
            credited = [*earned[:-1], earned[-1] * gamma**later]
            part.turn_rewards = earned
            part.reward, part.turn_returns = _discounted(credited, gamma)
    return traj
