"""Group feeding for the rollout executor: the dataset feeder, episode groups, their filters and counters.

Nothing here touches the event loop or threads.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from statistics import fmean, pstdev
from typing import Any, TypedDict

from areal_agents.types import Trajectory

__all__ = ["GROUP_FILTERS", "FeederState", "Group", "GroupFilter", "Ledger", "RowFeeder", "batch_metrics", "nonzero_std"]

class FeederState(TypedDict):
    """A :class:`RowFeeder`'s position (its ``state_dict``): the next row ``(epoch, index)`` of
    ``num_rows``, the shuffle, the rows marked as giving no signal and how many were skipped."""

    epoch: int
    index: int
    num_rows: int
    seed: int
    shuffle: bool
    no_signal: list[int]
    skipped: int


GroupFilter = Callable[[list[Trajectory]], bool]
"""``keep(group) -> bool``: False drops the whole group (counted as ``filter``)."""


def nonzero_std(group: list[Trajectory]) -> bool:
    """Keep a group only if its rewards are not all equal (DAPO dynamic sampling)."""
    rewards = [t.reward for t in group]
    return bool(rewards) and max(rewards) - min(rewards) > 1e-9 * max(1.0, max(map(abs, rewards)))


GROUP_FILTERS: dict[str, GroupFilter | None] = {"none": None, "nonzero_std": nonzero_std}
"""The filters ``RolloutConfig.group_filter`` names (``None`` keeps every group)."""


class RowFeeder:
    """Cycles over dataset rows epoch after epoch, in a seeded per-epoch order.

    The position ``(epoch, index)`` is the checkpointable dataloader state: the same seed
    and position give the same next rows, so a recovered run continues where it stopped.

    ``skip`` is the chance that a marked row (see :meth:`mark`; the executor marks a row whose
    last group every sample solved) is passed over when its turn comes: a prompt every sample
    solves mostly stays that way, and its group would be generated only to be dropped. The
    draw is a seeded function of the position, so skipping is reproducible and needs no state
    beyond the marked rows; a skipped row stays marked and gets its chance again next epoch.
    """

    def __init__(self, rows: Iterable[dict[str, Any]] | None, *, seed: int, shuffle: bool, skip: float = 0.0) -> None:
        self.rows: list[dict[str, Any]] = list(rows) if rows is not None else []
        for i, row in enumerate(self.rows):
            if not isinstance(row, dict):
                raise TypeError(f"rows[{i}] must be a dict (got {type(row).__name__})")
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.skip = float(skip)
        self.epoch = self.index = self.skipped = 0
        self.no_signal: set[int] = set()  # rows whose last group gave no learning signal
        self._orders: dict[int, list[int]] = {}  # the last two epochs' orders (groups resolve across a boundary)

    def __len__(self) -> int:
        return len(self.rows)

    def _row_index(self, epoch: int, index: int) -> int:
        if not self.shuffle:
            return index
        if epoch not in self._orders:
            order = list(range(len(self.rows)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = order
        return self._orders[epoch][index]

    def row_at(self, key: tuple[int, int]) -> dict[str, Any]:
        """The row at dataloader position ``key = (epoch, index)``."""
        return self.rows[self._row_index(*key)]

    def mark(self, key: tuple[int, int], signal: bool) -> None:
        """Record whether the group of the row at ``key`` gave a learning signal."""
        (self.no_signal.discard if signal else self.no_signal.add)(self._row_index(*key))

    def _passed_over(self, key: tuple[int, int]) -> bool:
        if self.skip <= 0 or self._row_index(*key) not in self.no_signal:
            return False
        return random.Random(f"{self.seed}/{key[0]}/{key[1]}").random() < self.skip

    def next(self) -> tuple[tuple[int, int], dict[str, Any]]:
        """``((epoch, index), row)`` of the next row not passed over; advances the position."""
        if not self.rows:
            raise IndexError("no rows to feed")
        for left in range(len(self.rows), 0, -1):  # after an epoch's worth of skips, the next row regardless
            key = (self.epoch, self.index)
            self.index += 1
            if self.index == len(self.rows):
                self.epoch, self.index = self.epoch + 1, 0
            if left == 1 or not self._passed_over(key):
                break
            self.skipped += 1
        return key, self.row_at(key)

    def state_dict(self) -> FeederState:
        return {"epoch": self.epoch, "index": self.index, "num_rows": len(self.rows),
                "seed": self.seed, "shuffle": self.shuffle, "no_signal": sorted(self.no_signal),
                "skipped": self.skipped}

    def load_state_dict(self, state: FeederState) -> None:
        n = int(state.get("num_rows", len(self.rows)))
        if n != len(self.rows):
            raise ValueError(f"rollout state was saved with {n} dataset rows, this run has {len(self.rows)}")
        epoch, index = int(state["epoch"]), int(state["index"])
        if epoch < 0 or not 0 <= index <= max(0, n - 1):
            raise ValueError(f"rollout state has an invalid dataloader position (epoch {epoch}, index {index})")
        no_signal = {int(i) for i in state.get("no_signal", [])}
        if any(not 0 <= i < n for i in no_signal):
            raise ValueError("rollout state marks rows outside the dataset")
        self.epoch, self.index = epoch, index
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.no_signal, self.skipped = no_signal, int(state.get("skipped", 0))
        self._orders = {}


@dataclass(eq=False)
class Group:
    """``size`` episodes of one row, launched together at ``start_version``.

    ``key`` is the row's dataloader position for auto-fed rows (``None`` for rows passed to
    ``submit``); ``stale`` is set when the group can no longer be consumed within the
    staleness bound and its episodes were cancelled; ``cancel_reason`` is why its episodes were
    cancelled (``stale`` or ``shutdown``), if they were.
    """

    serial: int
    group_id: str
    row: dict[str, Any]
    size: int
    seed: int
    key: tuple[int, int] | None = None
    start_version: int = -1
    stale: bool = False
    cancel_reason: str = ""
    trajectories: list[Trajectory | None] = field(default_factory=list)
    tasks: set[asyncio.Future[Trajectory]] = field(default_factory=set)  # running episode tasks

    def __post_init__(self) -> None:
        self.trajectories = [None] * self.size

    def members(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t is not None]

    @staticmethod
    def cancel_all(groups: list[Group], reason: str = "stale") -> None:
        """Cancel the running episodes of ``groups`` (event-loop thread), keeping each group's
        first ``cancel_reason``."""
        for g in groups:
            g.cancel_reason = g.cancel_reason or reason
            for task in list(g.tasks):
                task.cancel()


class Ledger:
    """Episode counters: each submitted episode ends in exactly one of accepted/failed/dropped.

    ``failed_by_status`` counts failed episodes per status; ``dropped_groups`` counts dropped
    groups per reason (``filter``, ``stale``, ``failed``).
    """

    def __init__(self) -> None:
        self.submitted = self.accepted = self.failed = self.dropped = 0
        self.failed_by_status: Counter[str] = Counter()
        self.dropped_groups: Counter[str] = Counter()
        self.failed_streak = 0  # consecutive groups in which every episode failed
        self.last_failed: Trajectory | None = None  # the last failed episode of such a group
        self.dropped_failed: deque[Trajectory] = deque(maxlen=1024)  # failed episodes of dropped groups, for the record

    def fail_unlaunched(self, size: int) -> None:
        """A group cancelled before it started: its episodes end ``aborted``."""
        self.failed += size
        self.failed_by_status["aborted"] += size

    def resolve(self, members: list[Trajectory], drop_reason: str) -> None:
        """Count a finished group: failed members as failed, ok ones accepted (or dropped).

        In a group dropped as ``stale``, the episodes the executor cancelled for it (``aborted``)
        count as dropped: nothing failed, the staleness rule discarded them."""
        failed = [t.status for t in members if not t.ok and not (drop_reason == "stale" and t.status == "aborted")]
        self.failed_by_status.update(failed)
        n_failed = len(failed)
        self.failed += n_failed
        if drop_reason != "stale":  # cancelled stale groups say nothing about the env or servers
            if members and n_failed == len(members):
                self.failed_streak += 1
                self.last_failed = members[-1]
            else:
                self.failed_streak = 0
        if drop_reason:
            self.dropped_failed.extend(t for t in members if not t.ok and t.status in failed)
            self.dropped += len(members) - n_failed
            self.dropped_groups[drop_reason] += 1
        else:
            self.accepted += len(members) - n_failed

    def take_dropped_failed(self) -> list[Trajectory]:
        """The failed episodes of the groups dropped since the last call (the latest 1,024)."""
        out = list(self.dropped_failed)
        self.dropped_failed.clear()
        return out

    def unaccept(self, members: list[Trajectory], drop_reason: str) -> None:
        """An accepted group is dropped after all (it became stale while waiting)."""
        n_ok = sum(t.ok for t in members)
        self.accepted -= n_ok
        self.dropped += n_ok
        self.dropped_groups[drop_reason] += 1

    def metrics(self) -> dict[str, float]:
        out = {f"rollout/failed/{k}": float(v) for k, v in self.failed_by_status.items()}
        out["rollout/dropped_groups"] = float(sum(self.dropped_groups.values()))
        out.update({f"rollout/dropped_groups/{k}": float(v) for k, v in self.dropped_groups.items()})
        return out


def batch_metrics(trajectories: list[Trajectory], version: int) -> dict[str, float]:
    """Reward, length and staleness metrics of one (non-empty) batch taken at weight ``version``."""
    rewards = [t.reward for t in trajectories]
    staleness = [float(version - t.start_version) for t in trajectories]
    return {
        "rollout/reward": fmean(rewards),
        "rollout/reward_std": pstdev(rewards),
        "rollout/episode_len": fmean(t.num_tokens for t in trajectories),
        "rollout/turns": fmean(t.num_turns for t in trajectories),
        "rollout/tokens": fmean(t.num_generated for t in trajectories),
        "staleness/mean": fmean(staleness),
        "staleness/max": max(staleness),
    }
