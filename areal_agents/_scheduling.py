"""The event-loop half of :class:`~areal_agents.rollout.RolloutExecutor`: launching and finishing episodes.

:class:`SchedulerMixin` holds the methods that run on the executor's loop thread (plus the
capacity rule they share with the caller-facing half in :mod:`areal_agents.rollout`). All
state is guarded by ``self._cond``; methods named ``*_locked`` expect it held.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from areal_agents._episode import EpisodeFn, episode_outcome
from areal_agents._groups import Group, GroupFilter, Ledger, RowFeeder
from areal_agents._loop_thread import LoopThread
from areal_agents.config import RolloutConfig
from areal_agents.types import Trajectory

__all__ = ["SchedulerMixin"]

log = logging.getLogger("areal_agents.rollout")


class _Episode:
    """One running episode: its task, timeout timer and why it was cancelled, if it was."""

    __slots__ = ("group", "k", "task", "timer", "reason", "abandoned")

    def __init__(self, group: Group, k: int) -> None:
        self.group, self.k = group, k
        self.task: asyncio.Future[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.reason = ""  # "timeout" | "stale" | "shutdown" once cancelled
        self.abandoned = False  # it ignored its cancellation and was counted as a timeout


class SchedulerMixin:
    """Episode launching, completion, accounting and staleness drops (see the module doc)."""

    cfg: RolloutConfig
    name: str
    _cond: threading.Condition
    _thread: LoopThread | None
    _state: str
    _error: BaseException | None
    _paused: bool
    _bounded: bool
    _version: int
    _serial: int
    _seed: int
    _G: int
    _B: int
    _episode_fn: EpisodeFn
    _feeder: RowFeeder
    _filter: GroupFilter | None
    _turn_discount: float | None
    _on_shutdown: list[Callable[[], Awaitable[Any]]]
    _pending: deque[Group]
    _active: dict[int, Group]
    _ready: list[tuple[int, int, Group]]
    _running: int
    _delivered_groups: int
    _ledger: Ledger
    _finished: int
    _gen_tokens: int

    async def _aclose(self, grace: float) -> None:
        with self._cond:
            while self._pending:  # never launched: they end as aborted
                self._ledger.fail_unlaunched(self._pending.popleft().size)
            episodes = [ep for g in self._active.values() for ep in g.tasks]
        for ep in episodes:
            self._cancel(ep, "shutdown")
        tasks = [ep.task for ep in episodes if ep.task is not None]
        if tasks:
            _, still = await asyncio.wait(tasks, timeout=grace)
            if still:
                log.warning("rollout: %d episodes ignored cancellation at shutdown", len(still))
        await asyncio.sleep(0)  # let the done-callbacks of the cancelled episodes run
        for hook in self._on_shutdown:
            try:
                await hook()
            except Exception as exc:  # a failing cleanup must not stop the shutdown
                log.warning("rollout: on_shutdown hook failed: %s: %s", type(exc).__name__, exc)

    def _new_group_locked(self, row: dict[str, Any], key: tuple[int, int] | None, serial: int | None = None) -> Group:
        if serial is None:
            serial, self._serial = self._serial, self._serial + 1
        seed = (self._seed * 1_000_003 + serial * self._G) % (2**31 - self._G)
        return Group(serial=serial, group_id=f"{self.name}-{serial}", row=row, size=self._G, seed=seed, key=key)

    def _kick(self) -> None:
        """Ask the loop thread to launch what capacity allows (from any thread)."""
        if self._thread is not None and self._state == "running":
            self._thread.call_soon(self._launch)

    def _capacity_locked(self) -> int:
        cap = self.cfg.max_concurrent_rollouts - self._running
        if self._bounded:
            started = (self._delivered_groups + len(self._active)) * self._G
            cap = min(cap, (self.cfg.max_head_offpolicyness + self._version + 1) * self._B - started)
        return cap

    def _fail(self, exc: BaseException) -> None:
        """A bug in the executor's own callbacks: make every waiter raise instead of hanging."""
        log.error("rollout executor failed: %s: %s", type(exc).__name__, exc)
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def _launch(self) -> None:
        """Launch whole groups while capacity allows (event-loop thread only)."""
        try:
            with self._cond:
                while self._state == "running" and not self._paused and self._capacity_locked() >= self._G:
                    if self._pending:
                        g = self._pending.popleft()
                    elif len(self._feeder):
                        key, row = self._feeder.next()
                        g = self._new_group_locked(row, key)
                        self._ledger.submitted += g.size
                    else:
                        break
                    self._start_group_locked(g)
        except Exception as exc:
            self._fail(exc)

    def _start_group_locked(self, g: Group) -> None:
        assert self._thread is not None
        loop = self._thread.loop
        g.start_version = self._version
        self._active[g.serial] = g
        for k in range(g.size):
            ep = _Episode(g, k)
            try:
                ep.task = asyncio.ensure_future(self._episode_fn(dict(g.row), g.seed + k, f"{g.group_id}-{k}"),
                                                loop=loop)
            except Exception as exc:  # episode_fn failed before returning an awaitable
                ep.task = loop.create_future()
                ep.task.set_exception(exc)
            ep.timer = loop.call_later(self.cfg.episode_timeout, self._time_out, ep)
            g.tasks.add(ep)
            self._running += 1
            ep.task.add_done_callback(functools.partial(self._on_done, ep))

    @staticmethod
    def _cancel(ep: _Episode, reason: str) -> None:
        if ep.task is not None and not ep.task.done():
            ep.reason = ep.reason or reason
            ep.task.cancel()

    def _time_out(self, ep: _Episode) -> None:
        """Cancel an episode past ``episode_timeout``; abandon it if it ignores the cancellation."""
        self._cancel(ep, "timeout")
        if ep.task is not None and not ep.task.done() and self._thread is not None:
            ep.timer = self._thread.loop.call_later(min(5.0, self.cfg.episode_timeout), self._abandon, ep)

    def _abandon(self, ep: _Episode) -> None:
        """An episode that swallowed its cancellation (e.g. a catch-all retry loop in an async env)
        is counted as a timeout now, so its group and its slot are not held forever."""
        if ep.task is None or ep.task.done() or ep.abandoned:
            return
        log.warning("rollout: episode %s-%d ignored its cancellation; counted as a timeout", ep.group.group_id, ep.k)
        ep.abandoned = True
        traj = Trajectory(status="timeout", info={"error": "episode timed out and ignored its cancellation"})
        self._finish(ep, self._stamp(ep, traj))

    # ------------------------------------------------------------------ completion
    def _collect(self, ep: _Episode) -> Trajectory:
        assert ep.task is not None
        return self._stamp(ep, episode_outcome(ep.task, ep.reason, self._turn_discount))

    @staticmethod
    def _stamp(ep: _Episode, traj: Trajectory) -> Trajectory:
        g = ep.group
        traj.group_id, traj.start_version = g.group_id, g.start_version
        traj.info.setdefault("episode_id", f"{g.group_id}-{ep.k}")
        traj.info.setdefault("seed", g.seed + ep.k)
        return traj

    def _on_done(self, ep: _Episode, _task: object = None) -> None:
        if ep.abandoned:  # already counted when it was abandoned
            return
        try:
            traj = self._collect(ep)
        except Exception as exc:
            self._fail(exc)
            return
        self._finish(ep, traj)

    def _finish(self, ep: _Episode, traj: Trajectory) -> None:
        if ep.timer is not None:
            ep.timer.cancel()
        g = ep.group
        try:
            with self._cond:
                self._running -= 1
                self._finished += 1
                self._gen_tokens += traj.num_generated
                g.tasks.discard(ep)
                g.trajectories[ep.k] = traj
                g.done += 1
                if g.complete:
                    self._resolve_locked(g)
        except Exception as exc:  # e.g. a user group filter raising
            self._fail(exc)
            return
        self._launch()

    def _is_stale_locked(self, g: Group) -> bool:
        return self._bounded and g.start_version < self._version - self.cfg.max_head_offpolicyness

    def _resolve_locked(self, g: Group) -> None:
        """Count a finished group's episodes and queue it for the trainer, or drop it."""
        del self._active[g.serial]
        members = g.members()
        failed = [t for t in members if not t.ok]
        reason = ""
        if g.stale or self._is_stale_locked(g):
            reason = "stale"
        elif failed and self.cfg.failure_policy == "drop":
            reason = "failed"
        else:
            for t in failed:  # failure_policy == "zero": keep, with no reward
                t.set_rewards([0.0] * len(t.turn_rewards), 1.0)
            if self._filter is not None and not self._filter(members):
                reason = "filter"
        self._ledger.resolve(members, reason)
        if not reason:
            self._delivered_groups += 1
            heapq.heappush(self._ready, (g.start_version, g.serial, g))
        self._cond.notify_all()

    def _drop_stale_ready_locked(self) -> int:
        if not self._bounded:
            return 0
        stale = [item for item in self._ready if self._is_stale_locked(item[2])]
        if stale:
            for item in stale:
                self._ledger.unaccept(item[2].members(), "stale")
            self._delivered_groups -= len(stale)
            self._ready = [item for item in self._ready if not self._is_stale_locked(item[2])]
            heapq.heapify(self._ready)
        return len(stale)

    def _cancel_groups(self, groups: list[Group]) -> None:
        for g in groups:
            for ep in list(g.tasks):
                self._cancel(ep, "stale")
