"""The :class:`Rollout` protocol: what the trainer asks of a rollout, wherever it runs (no torch).

:class:`~areal_agents.rollout.executor.RolloutExecutor` (a thread of this process) and
:class:`~areal_agents.rollout.process.RolloutProcess` (the same executor in a child process)
both implement it, and so does an online run's :class:`~areal_agents.online.rollout.OnlineRollout`,
so the RL loop holds a ``Rollout`` and never asks which one it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypedDict

from areal_agents.config import RolloutConfig
from areal_agents.rollout.groups import FeederState
from areal_agents.types import Trajectory

__all__ = ["Rollout", "RolloutState", "SavedRollout"]


class RolloutState(TypedDict):
    """What a checkpoint keeps of a rollout (its ``state_dict``): the dataloader position, the
    group serial, how many groups were consumed, and ``[epoch, index, serial]`` of each row
    whose group was started but not consumed (re-run after recovery)."""

    feeder: FeederState
    serial: int
    consumed_groups: int
    unconsumed: list[list[int]]


SavedRollout = Mapping[str, Any]
"""What a checkpoint keeps of any rollout: a dataset run's :class:`RolloutState`, an online run's
:class:`~areal_agents.online.sessions.OnlineState`; each rollout loads only its own."""


class Rollout(Protocol):
    """Episode groups run asynchronously under the staleness bound and handed out in batches.

    The calls behave as :class:`~areal_agents.rollout.executor.RolloutExecutor`'s, whose
    docstrings are the reference; ``runs_in`` says where the episodes run, in words.
    """

    cfg: RolloutConfig
    runs_in: str

    def start(self) -> Rollout: ...

    def shutdown(self, timeout: float = 30.0) -> None: ...

    @property
    def running(self) -> bool: ...

    @property
    def bounded_staleness(self) -> bool: ...

    @bounded_staleness.setter
    def bounded_staleness(self, value: bool) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def set_version(self, version: int) -> None: ...

    def wait(self, count: int, timeout: float | None = None) -> list[list[Trajectory]]: ...

    def prepare_batch(self, timeout: float | None = None) -> list[list[Trajectory]]: ...

    def take_failed(self) -> list[Trajectory]: ...
    def stats(self) -> dict[str, float]: ...

    def counts(self) -> dict[str, int]: ...

    def state_dict(self) -> SavedRollout: ...

    def load_state_dict(self, state: Any) -> None: ...
