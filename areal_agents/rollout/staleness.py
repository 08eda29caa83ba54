"""The staleness bound of the rollout executor (as in AReaL-lite): how many episodes may start.

With ``B = batch_size · group_size`` episodes per training batch, η = ``max_head_offpolicyness``
and ``v`` the current weight version, a group is launched only while ``group_size`` episodes
fit into

    capacity = min(max_concurrent_rollouts − running,
                   (η + v + 1)·B − (accepted + in_flight))

where ``accepted`` counts the episodes of groups handed out or waiting in the ready queue and
``in_flight`` those of launched, unfinished groups (both in whole groups). On top of this, a
group that started at version ``s < v − η`` can never be consumed: it is cancelled or dropped
(``stale``). Hence the guarantee: **every trajectory in a batch taken at version t started at
version ≥ t − η**. With η = 0 the executor is synchronous: it generates exactly one batch with
the current weights and waits for the next version. Unbounded (rollout-only mode, evaluation),
only ``max_concurrent_rollouts`` limits launches and nothing is ever stale.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StalenessBound"]


@dataclass(frozen=True)
class StalenessBound:
    """η, the batch size in episodes and the concurrency cap; ``bounded=False`` lifts η."""

    eta: int
    batch_episodes: int
    max_concurrent: int
    bounded: bool = True

    def capacity(self, version: int, running: int, started: int) -> int:
        """Episodes that may start now: ``running`` are executing, ``started`` belong to groups
        launched or delivered since the start (whole groups)."""
        cap = self.max_concurrent - running
        if self.bounded:
            cap = min(cap, (self.eta + version + 1) * self.batch_episodes - started)
        return cap

    def is_stale(self, start_version: int, version: int) -> bool:
        """Whether an episode started at ``start_version`` can no longer be consumed at ``version``."""
        return self.bounded and start_version < version - self.eta
