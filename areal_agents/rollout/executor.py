"""The asynchronous rollout executor: agent episodes on a background event loop, bounded staleness.

:class:`RolloutExecutor` runs ``episode_fn(row, seed, episode_id) -> Trajectory`` coroutines (env + agent + LLM
client, :func:`make_episode_fn`) in an asyncio loop on its own thread, ``group_size`` per row, and hands out groups.

**Staleness control**: groups are launched as :mod:`areal_agents.rollout.staleness` allows; when
``set_version(v)`` makes a running group stale its episodes are cancelled and it is dropped (``stale``), and
ready batches are checked again when they are taken, so every trajectory in a batch taken at version t started at
version ≥ t − η. Each episode runs under :func:`~areal_agents.rollout.episode.with_deadline` (``episode_timeout``).

**Accounting.** Every submitted episode ends in one counter: ``submitted == accepted + failed + dropped + in_flight``:
``accepted`` — ``ok`` episodes of groups handed out or ready to be; ``failed`` — non-``ok`` episodes (``env_error``,
``reward_error``, ``timeout``, ``server_error``, ``aborted``), per status in ``rollout/failed/<status>``, those of
dropped groups kept for the episode record (:meth:`RolloutExecutor.take_failed`): ``failure_policy=drop`` drops the
failed episode's whole group, ``zero`` keeps it with reward 0 (:func:`~areal_agents.rollout.returns.settle_returns`);
``dropped`` — ``ok`` episodes discarded with their group: by the group filter (``nonzero_std``; after
``4 × batch_size`` groups in a row fail it, groups are kept until one passes again, so that training goes on), for
staleness, or for a failed sibling under ``drop`` (``rollout/dropped_groups/<reason>``); ``in_flight`` — queued,
running, finished but waiting for the rest of their group, or being scored (:mod:`~areal_agents.rollout.group_scoring`).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any

from areal_agents.config import RolloutConfig
from areal_agents.failures import EpisodesFailed, failure_message
from areal_agents.rollout.episode import EpisodeFn, episode_outcome, episode_solved, with_deadline
from areal_agents.rollout.group_scoring import GroupScorer
from areal_agents.rollout.groups import GROUP_FILTERS, Group, GroupFilter, Ledger, RowFeeder, batch_metrics, nonzero_std
from areal_agents.rollout.interface import RolloutState
from areal_agents.rollout.staleness import StalenessBound
from areal_agents.runtime.loop_thread import LoopThread
from areal_agents.types import Trajectory

__all__ = ["RolloutExecutor"]

log = logging.getLogger("areal_agents.rollout")


class RolloutExecutor:
    """Runs episode groups asynchronously and returns training batches (see the module doc).

    ``rows`` are cycled epoch after epoch (shuffled per epoch with ``seed`` when ``shuffle``); ``submit(row)``
    adds a group by hand. Every episode's return is settled from its ``turn_rewards`` with γ = ``turn_discount``
    (``env.turn_discount``, checked by the config) and ``cfg.failure_policy``. ``group_filter`` overrides
    ``cfg.group_filter`` with a callable ``keep(group) -> bool``. ``on_shutdown`` coroutine functions run on the
    executor's loop at shutdown (e.g. closing an HTTP client session that lives on that loop). ``group_scorer``
    scores each finished group before it is resolved (``rollout.group_reward``).
    ``bounded_staleness=False`` limits launches by ``max_concurrent_rollouts`` only (rollout-only mode and
    evaluation). When every episode of ``max_failed_streak`` groups in a row failed (servers down, a broken env),
    waiting raises :class:`EpisodesFailed` naming the failed component and its last error instead of spinning
    forever (0 disables). Implements :class:`~areal_agents.rollout.interface.Rollout`.
    """

    runs_in = "a thread of the trainer"

    def __init__(self, cfg: RolloutConfig, *, episode_fn: EpisodeFn, rows: Iterable[dict[str, Any]] | None = None,
                 seed: int = 1, shuffle: bool = True, turn_discount: float = 1.0, group_filter: GroupFilter | None = None,
                 on_shutdown: Iterable[Callable[[], Awaitable[object]]] = (), group_scorer: GroupScorer | None = None,
                 bounded_staleness: bool = True, max_failed_streak: int = 32) -> None:
        self.cfg = cfg  # validated by RolloutConfig itself
        self._bound = StalenessBound(cfg.max_head_offpolicyness, cfg.batch_size * cfg.group_size,
                                     cfg.max_concurrent_rollouts, bounded_staleness)
        self._episode_fn = episode_fn
        self._feeder = RowFeeder(rows, seed=seed, shuffle=shuffle, skip=cfg.skip_no_signal)
        self._seed = int(seed)
        self._turn_discount = turn_discount  # env.turn_discount, checked by the config
        self._filter = group_filter if group_filter is not None else GROUP_FILTERS[cfg.group_filter]
        self._filtered_in_a_row = 0  # groups the filter dropped since one passed it
        self._on_shutdown, self._group_scorer = list(on_shutdown), group_scorer
        self._max_failed_streak, self._G = max_failed_streak, cfg.group_size
        self._cond = threading.Condition(threading.RLock())  # reentrant: state_dict() from a signal handler
        self._thread: LoopThread | None = None
        self._state = "new"  # new -> running -> closing -> closed
        self._error: BaseException | None = None
        self._paused = False
        self._version = self._serial = 0
        self._pending: deque[Group] = deque()  # submitted, not launched yet
        self._active: dict[int, Group] = {}  # launched, not resolved
        self._ready: list[tuple[int, int, Group]] = []  # heap by (start_version, serial)
        self._running, self._done = 0, Counter[str]()  # episodes running; sums over those finished (episodes, ...)
        self._delivered_groups = 0  # groups handed out or in the ready queue (capacity)
        self._consumed_groups = 0
        self._ledger = Ledger()
        self._last_batch: dict[str, float] = {}
        self._rate_mark = (time.monotonic(), Counter[str]())

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RolloutExecutor:
        """Start the background event loop and begin launching episodes."""
        with self._cond:
            if self._state != "new":
                raise RuntimeError(f"rollout executor cannot start: it is {self._state}")
            self._state = "running"
            self._rate_mark = (time.monotonic(), self._done.copy())
            self._thread = LoopThread("rollout-loop")
        self._thread.start()
        self._kick()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel in-flight episodes (counted ``aborted``), run ``on_shutdown``, stop the loop thread.

        Idempotent. Ready groups stay counted as accepted; nothing is left running.
        """
        with self._cond:
            state, self._state = self._state, ("closing" if self._state == "running" else "closed")
            self._cond.notify_all()
        if state != "running":
            return
        assert self._thread is not None
        try:
            self._thread.run(self._aclose(timeout / 2), timeout)
        finally:
            self._thread.stop(timeout)
            with self._cond:
                self._state = "closed"

    def __enter__(self) -> RolloutExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def run_coroutine(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the executor's event loop and return its result (from another thread)."""
        if self._thread is None or self._state != "running":
            raise RuntimeError("rollout executor is not running")
        return self._thread.run(coro, timeout)

    # ------------------------------------------------------------------ feeding
    def submit(self, row: dict[str, Any]) -> str:
        """Queue one group (``group_size`` episodes) of ``row``; returns its ``group_id``."""
        if not isinstance(row, dict):
            raise TypeError(f"submit() needs a dict row (got {type(row).__name__})")
        with self._cond:
            if self._state in ("closing", "closed"):
                raise RuntimeError("rollout executor is shut down")
            g = self._new_group_locked(row, None)
            self._pending.append(g)
        self._kick()
        return g.group_id

    # ------------------------------------------------------------------ versions and pausing
    def set_version(self, version: int) -> None:
        """Set the weight version new episodes start at; cancels groups that became too stale."""
        with self._cond:
            self._version = int(version)
            self._drop_stale_ready_locked()
            stale = [g for g in self._active.values()
                     if not g.stale and self._bound.is_stale(g.start_version, self._version)]
            for g in stale:
                g.stale = True
        if stale and self._thread is not None and self._state == "running":
            self._thread.call_soon(Group.cancel_all, stale)
        self._kick()

    def pause(self) -> None:
        """Stop launching episodes (in-flight ones continue); returns once no new one can start."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        """Launch episodes again as capacity allows."""
        with self._cond:
            self._paused = False
        self._kick()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`shutdown`."""
        return self._state == "running"

    @property
    def bounded_staleness(self) -> bool:
        """Whether the η bound limits launches (False: only ``max_concurrent_rollouts`` does)."""
        return self._bound.bounded

    @bounded_staleness.setter
    def bounded_staleness(self, value: bool) -> None:
        with self._cond:
            self._bound = replace(self._bound, bounded=bool(value))
        self._kick()

    # ------------------------------------------------------------------ consuming
    def wait(self, count: int, timeout: float | None = None) -> list[list[Trajectory]]:
        """Take ``count`` finished groups (oldest start version first), blocking up to ``timeout`` s.

        Raises ``TimeoutError`` (nothing is taken) when they are not ready in time.
        """
        if count < 1:
            raise ValueError(f"count must be >= 1 (got {count})")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise RuntimeError(f"rollout executor failed: {self._error}") from self._error
                if self._state != "running":
                    raise RuntimeError(f"rollout executor is {self._state}: call start() first"
                                       if self._state == "new" else f"rollout executor is {self._state}")
                if self._drop_stale_ready_locked():
                    self._kick()
                if len(self._ready) >= count:
                    groups = [heapq.heappop(self._ready)[2] for _ in range(count)]
                    self._consumed_groups += count
                    return [g.members() for g in groups]
                streak, last = self._ledger.failed_streak, self._ledger.last_failed
                if self._max_failed_streak and streak >= self._max_failed_streak and last is not None:
                    raise EpisodesFailed(failure_message(f"rollout: every episode of the last {streak} groups "
                                                         "failed", last))
                if not self._active:  # nothing running: would anything ever start?
                    if not (self._pending or len(self._feeder)):
                        raise RuntimeError(f"rollout executor has no rows left: {len(self._ready)} of {count} "
                                           "groups ready and nothing in flight")
                    if self._paused:
                        raise RuntimeError("rollout executor is paused with nothing in flight: call resume() "
                                           "before waiting for a batch")
                    if self._capacity_locked() < self._G and self._running == 0:
                        raise RuntimeError(f"rollout: staleness bound reached at version {self._version} "
                                           f"(max_head_offpolicyness={self.cfg.max_head_offpolicyness}): "
                                           "call set_version() after each training step")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"rollout: {len(self._ready)} of {count} groups ready after {timeout} s")
                self._cond.wait(remaining)

    def prepare_batch(self, timeout: float | None = None) -> list[list[Trajectory]]:
        """One training batch: ``batch_size`` groups of ``group_size`` episodes; updates :meth:`stats`."""
        groups = self.wait(self.cfg.batch_size, timeout)
        metrics = batch_metrics([t for g in groups for t in g], self._version)
        sized = [g for g in groups if len(g) > 1]  # groups of one: is there any spread in the batch?
        metrics["rollout/signal_groups"] = (sum(map(nonzero_std, sized)) / len(sized) if sized
                                            else float(metrics["rollout/reward_std"] > 0))
        now = time.monotonic()
        with self._cond:
            t0, before = self._rate_mark
            self._rate_mark = (now, self._done.copy())
            dt, done = max(now - t0, 1e-9), self._done - before
            metrics["perf/episodes_per_s"], metrics["perf/gen_tokens_per_s"] = done["episodes"] / dt, done["gen_tokens"] / dt
            metrics["time/reward_s"] = done["reward_us"] / 1e6  # reward calls' seconds since the last batch, summed
            metrics.update({"perf/judge_calls_per_s": done["judge_calls"] / dt} if done["judge_calls"] else {})
            self._last_batch = metrics
        return groups

    # ------------------------------------------------------------------ metrics and state
    def counts(self) -> dict[str, int]:
        """Episode counters; ``submitted == accepted + failed + dropped + in_flight`` always."""
        with self._cond:
            in_flight = sum(g.size for g in self._pending) + sum(g.size for g in self._active.values())
            led = self._ledger
            return {"submitted": led.submitted, "accepted": led.accepted, "failed": led.failed, "dropped": led.dropped,
                    "in_flight": in_flight, "running": self._running, "ready_groups": len(self._ready)}

    def stats(self) -> dict[str, float]:
        """Metrics of the last batch plus cumulative counters, with fixed names (``perf/*`` and ``time/reward_s``:
        every episode finished since the previous batch); what each means: docs/metrics.md."""
        with self._cond:
            counts = {f"rollout/{k}": float(v) for k, v in self.counts().items() if k != "ready_groups"}
            return {**self._last_batch, **counts, **self._ledger.metrics(), "rollout/version": float(self._version),
                    "rollout/skipped_rows": float(self._feeder.skipped)}

    def take_failed(self) -> list[Trajectory]:
        """The failed episodes of the groups dropped since the last call (the latest 1,024), for the record."""
        with self._cond:
            return self._ledger.take_dropped_failed()

    def state_dict(self) -> RolloutState:
        """Dataloader position plus the rows of groups not yet consumed (re-run after recovery)."""
        with self._cond:
            groups = [*self._pending, *(g for g in self._active.values() if not g.stale),
                      *(item[2] for item in self._ready)]
            unconsumed = sorted([g.key[0], g.key[1], g.serial] for g in groups if g.key is not None)
            return {"feeder": self._feeder.state_dict(), "serial": self._serial,
                    "consumed_groups": self._consumed_groups, "unconsumed": unconsumed}

    def load_state_dict(self, state: RolloutState) -> None:
        """Restore :meth:`state_dict` before :meth:`start`; unconsumed rows are queued first."""
        with self._cond:
            if self._state != "new":
                raise RuntimeError("load_state_dict() must be called before start()")
            try:
                self._feeder.load_state_dict(state["feeder"])
                self._serial = int(state["serial"])
                self._consumed_groups = self._delivered_groups = int(state["consumed_groups"])
                keys = [(int(e), int(i), int(s)) for e, i, s in state["unconsumed"]]
            except (KeyError, TypeError) as exc:
                raise ValueError(f"invalid rollout state (missing or malformed {exc})") from None
            for epoch, index, serial in keys:
                self._pending.append(self._new_group_locked(self._feeder.row_at((epoch, index)), (epoch, index), serial))

    # ------------------------------------------------------------------ event-loop side
    async def _aclose(self, grace: float) -> None:
        with self._cond:
            while self._pending:  # never launched: they end as aborted
                self._ledger.fail_unlaunched(self._pending.popleft().size)
            groups = list(self._active.values())
        tasks = [task for g in groups for task in g.tasks]
        Group.cancel_all(groups, "shutdown")
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
        """A new group of ``row``, its episodes counted as submitted."""
        if serial is None:
            serial, self._serial = self._serial, self._serial + 1
        seed = (self._seed * 1_000_003 + serial * self._G) % (2**31 - self._G)
        self._ledger.submitted += self._G
        return Group(serial=serial, group_id=f"rollout-{serial}", row=row, size=self._G, seed=seed, key=key)

    def _kick(self) -> None:
        """Ask the loop thread to launch what capacity allows (from any thread)."""
        if self._thread is not None and self._state == "running":
            self._thread.call_soon(self._launch)

    def _capacity_locked(self) -> int:
        started = (self._delivered_groups + len(self._active)) * self._G
        return self._bound.capacity(self._version, self._running, started)

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
            task: asyncio.Future[Trajectory]
            try:
                episode = self._episode_fn(dict(g.row), g.seed + k, f"{g.group_id}-{k}")
                task = asyncio.ensure_future(with_deadline(episode, self.cfg.episode_timeout), loop=loop)
            except Exception as exc:  # episode_fn failed before returning an awaitable
                task = loop.create_future()
                task.set_exception(exc)
            g.tasks.add(task)
            self._running += 1
            task.add_done_callback(functools.partial(self._on_done, g, k))

    # ------------------------------------------------------------------ completion
    def _on_done(self, g: Group, k: int, task: asyncio.Future[Trajectory]) -> None:
        try:
            traj = episode_outcome(task, g.cancel_reason, self._turn_discount, self.cfg.failure_policy)
            traj.group_id, traj.start_version = g.group_id, g.start_version
            traj.info.setdefault("episode_id", f"{g.group_id}-{k}")
            traj.info.setdefault("seed", g.seed + k)
            with self._cond:
                self._running -= 1
                self._done.update(episodes=1, gen_tokens=traj.num_generated, judge_calls=traj.info.get("judge_calls", 0),
                                  reward_us=round(1e6 * traj.info.get("reward_s", 0.0)))
                g.tasks.discard(task)
                g.trajectories[k] = traj
                if None not in g.trajectories:  # the group's last episode
                    self._score_or_resolve_locked(g)
        except Exception as exc:  # e.g. a user group filter raising
            self._fail(exc)
            return
        self._launch()

    def _score_or_resolve_locked(self, g: Group) -> None:
        """Resolve a finished group, once the group reward (``group_scorer``) has scored it, if any."""
        if self._group_scorer is None or g.stale or g.cancel_reason:
            return self._resolve_locked(g)
        scoring = asyncio.ensure_future(self._group_scorer(g.row, g.members()), loop=self._thread.loop)  # type: ignore[union-attr]
        g.tasks.add(scoring)  # type: ignore[arg-type]  # cancelled with the group's episodes
        scoring.add_done_callback(functools.partial(self._scored, g))

    def _scored(self, g: Group, scoring: asyncio.Future[tuple[float, int]]) -> None:
        try:  # as in _on_done: a failure here (e.g. a user group filter raising) fails the run, never lost
            with self._cond:
                g.tasks.discard(scoring)  # type: ignore[arg-type]
                error = "cancelled" if scoring.cancelled() else scoring.exception()
                for t in g.members() if error else ():  # cancelled (stale, shutdown), or the scorer raised
                    t.status, t.info["error"] = "aborted" if scoring.cancelled() else "reward_error", f"group reward: {error!r}"
                seconds, calls = (0.0, 0) if error else scoring.result()
                self._done.update(reward_us=round(1e6 * seconds), judge_calls=calls)
                self._resolve_locked(g)
        except Exception as exc:
            return self._fail(exc)
        self._launch()

    def _resolve_locked(self, g: Group) -> None:
        """Count a finished group's episodes and queue it for the trainer, or drop it."""
        del self._active[g.serial]
        members = g.members()
        failed = [t for t in members if not t.ok]
        reason = ""
        if g.stale or self._bound.is_stale(g.start_version, self._version):
            reason = "stale"
        elif failed and self.cfg.failure_policy == "drop":
            reason = "failed"
        else:
            if self._filter is not None:
                signal = self._filter(members)
                self._filtered_in_a_row = 0 if signal else self._filtered_in_a_row + 1
                if 0 < self._filtered_in_a_row <= 4 * self.cfg.batch_size:
                    reason = "filter"
                if g.key is not None:  # a row every sample solved may be skipped; one none solved may not
                    self._feeder.mark(g.key, signal or not all(map(episode_solved, members)))
        self._ledger.resolve(members, reason)
        if not reason:
            self._delivered_groups += 1
            heapq.heappush(self._ready, (g.start_version, g.serial, g))
        self._cond.notify_all()

    def _drop_stale_ready_locked(self) -> int:
        """Drop the ready groups that became stale: the oldest ones, as the heap is by start version."""
        dropped = 0
        while self._ready and self._bound.is_stale(self._ready[0][0], self._version):
            self._ledger.unaccept(heapq.heappop(self._ready)[2].members(), "stale")
            self._delivered_groups -= 1
            dropped += 1
        return dropped
