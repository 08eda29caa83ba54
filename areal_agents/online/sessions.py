"""The sessions of an online run and their ledger (no HTTP, no torch).

A *session* is one episode played by an agent outside the run: opened with the admin key, its
chat completions recorded token for token (a :class:`~areal_agents.openai_compat.session.ChatSession`),
then either rewarded (it waits to be trained), ended without a reward, or left to expire. The
:class:`SessionBook` holds them all and keeps the ledger::

    opened == trained + dropped (by reason) + in_flight      (in_flight = open + waiting)

Drop reasons: ``no_reward`` (ended without one), ``expired`` (no reward within ``ttl`` seconds of
the last call, or of the opening when there was none), ``no_calls`` (rewarded or ended having made
no call), ``stale`` (its oldest token came from weights more than η versions behind the trainer),
``restart`` (open when the run stopped and was recovered from a checkpoint) and ``run_ended``
(open or waiting when the run ended).

**Batches.** The trainer takes a batch once ``batch_sessions`` rewarded sessions are ready, oldest
first, in whole groups: sessions opened with the same ``group`` are one group (a GRPO group, as
``group_size`` samples of one prompt are in a normal run), ready when none of its sessions is
still open; sessions without a group, and groups with one rewarded session left, share one group
per batch, so their baseline is the batch's mean reward (with no prompt to compare against, the
other sessions of the step are the best estimate of what an average session earns).

**Returns.** A session's calls become trajectories as an OpenAI-style agent's do
(:func:`~areal_agents.openai_compat.trajectories.assemble`): one reward is earned at the session's
last call; one reward per call is earned at each call (each chain of calls that extend one another
earns its own calls' rewards); :func:`~areal_agents.rollout.returns.settle_returns` applies γ.
Thread-safe: the gateway's loop and the trainer's thread both call it.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from areal_agents.openai_compat.session import ChatSession
from areal_agents.openai_compat.trajectories import assemble
from areal_agents.rollout.returns import settle_returns
from areal_agents.rollout.staleness import StalenessBound
from areal_agents.types import Trajectory

__all__ = ["DROP_REASONS", "OnlineState", "Refused", "Session", "SessionBook"]

DROP_REASONS = ("no_reward", "expired", "no_calls", "stale", "restart", "run_ended")
"""Why a session was dropped (see the module docstring)."""


class Refused(Exception):
    """A request the book refuses, with the HTTP status and error code to answer it with."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class OnlineState(TypedDict):
    """What a checkpoint keeps of an online run: the ledger's counts, the rewarded sessions not
    trained yet (kept across a restart) and the serial of the next session."""

    kind: str
    opened: int
    trained: int
    dropped: dict[str, int]
    waiting: list[dict[str, Any]]
    serial: int


@dataclass(eq=False)
class Session:
    """One external episode (see the module docstring); ``key`` is its secret, ``sid`` its public id."""

    sid: str
    key: str
    group: str | None
    metadata: dict[str, Any]
    chat: ChatSession | None
    opened_version: int
    last_call: float
    state: str = "open"  # open -> waiting -> trained, or -> dropped
    reason: str = ""  # why it was dropped
    calls_running: int = 0
    trajectory: Trajectory | None = None
    ready_order: int = 0  # when it was rewarded (the book's counter): batches take the oldest first
    _taken_in: str = field(default="", repr=False)

    @property
    def start_version(self) -> int:
        """The oldest weight version of its sampled tokens (the version it was opened at if none)."""
        traj = self.trajectory
        versions = [v for part in ([traj, *traj.segments] if traj is not None else []) for v in part.versions
                    if v >= 0]
        return min(versions) if versions else self.opened_version


class SessionBook:
    """The sessions of an online run (see the module docstring).

    ``ttl``: seconds a session may wait for its reward after its last call; ``max_open``: sessions
    open at once; ``batch_sessions``: rewarded sessions per batch; ``bound``: the staleness rule
    (its η); ``turn_discount``: γ; ``trajectory_mode``: how calls become trajectories;
    ``bounded_admission``: refuse to open sessions beyond what the trainer can take within η
    versions (:meth:`StalenessBound.capacity <areal_agents.rollout.staleness.StalenessBound.capacity>`
    with the open sessions as running and every session not dropped as started).
    """

    def __init__(self, *, ttl: float, max_open: int, batch_sessions: int, bound: StalenessBound,
                 turn_discount: float = 1.0, trajectory_mode: str = "concat", bounded_admission: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.max_open, self.batch_sessions = float(ttl), int(max_open), int(batch_sessions)
        self.bounded_admission = bounded_admission
        self.bound, self.turn_discount, self.trajectory_mode = bound, turn_discount, trajectory_mode
        self.clock = clock
        self.version = 0
        self.opened = self.trained = 0
        self.rewarded = self.rewarded_tokens = 0  # sessions rewarded in this process, and their sampled tokens
        self.dropped: Counter[str] = Counter()
        self.cond = threading.Condition(threading.RLock())
        self._by_key: dict[str, Session] = {}  # open or waiting
        self._serial = 0
        self._ready_counter = 0
        self._batches = 0
        self.closed = False

    # ------------------------------------------------------------------ the ledger
    def counts(self) -> dict[str, int]:
        """``opened == trained + dropped + in_flight`` (``in_flight == open + waiting``)."""
        with self.cond:
            open_ = sum(s.state == "open" for s in self._by_key.values())
            waiting = len(self._by_key) - open_
            return {"opened": self.opened, "trained": self.trained, "dropped": sum(self.dropped.values()),
                    "in_flight": open_ + waiting, "open": open_, "waiting": waiting}

    def metrics(self) -> dict[str, float]:
        """The ledger as ``online/*`` metrics (``online/dropped/<reason>`` per reason)."""
        with self.cond:
            c = self.counts()
            out = {"online/opened": float(c["opened"]), "online/trained": float(c["trained"]),
                   "online/dropped": float(c["dropped"]), "online/in_flight": float(c["in_flight"]),
                   "online/open": float(c["open"]), "online/waiting": float(c["waiting"])}
            out.update({f"online/dropped/{r}": float(n) for r, n in sorted(self.dropped.items())})
            return out

    def _drop(self, s: Session, reason: str) -> None:
        s.state, s.reason = "dropped", reason
        s.chat = None  # its records are not needed any more
        self._by_key.pop(s.key, None)
        self.dropped[reason] += 1

    # ------------------------------------------------------------------ sessions
    def open(self, group: str | None = None, metadata: dict[str, Any] | None = None,
             chat: ChatSession | None = None) -> Session:
        """A new open session (its key is a fresh secret); ``Refused`` (429) at ``max_open``."""
        with self.cond:
            if self.closed:
                raise Refused("the run is ending: no new sessions", 503, "run_ended")
            open_ = sum(s.state == "open" for s in self._by_key.values())
            if open_ >= self.max_open:
                raise Refused(f"{self.max_open} sessions are open (online.max_open_sessions): reward or end some "
                              "first", 429, "too_many_sessions")
            if self.bounded_admission and self.bound.capacity(self.version, open_, self.trained + len(self._by_key)) < 1:
                raise Refused(f"the trainer is behind (weight version {self.version}): no session opened now could "
                              "be trained within the staleness bound; retry in a moment", 429, "trainer_behind")
            self._serial += 1
            s = Session(sid=f"ses-{self._serial}", key="sk-ses-" + secrets.token_urlsafe(24), group=group,
                        metadata=dict(metadata or {}), chat=chat, opened_version=self.version, last_call=self.clock())
            self._by_key[s.key] = s
            self.opened += 1
            return s

    def get(self, key: str) -> Session | None:
        """The open or waiting session of ``key`` (None: unknown, or no longer held)."""
        with self.cond:
            return self._by_key.get(key)

    def by_id(self, sid: str) -> Session | None:
        """The open or waiting session whose id is ``sid``."""
        with self.cond:
            return next((s for s in self._by_key.values() if s.sid == sid), None)

    def open_session(self, key: str) -> Session:
        """The open session of ``key``; ``Refused`` otherwise (404 unknown or gone, 409 rewarded)."""
        with self.cond:
            s = self._by_key.get(key)
            if s is None:
                raise Refused("no open session has this key (unknown, ended, or expired after online.session_ttl)",
                              404, "session_not_found")
            if s.state != "open":
                raise Refused(f"session {s.sid} was already rewarded", 409, "session_closed")
            return s

    def call_started(self, s: Session) -> None:
        with self.cond:
            s.calls_running += 1
            s.last_call = self.clock()

    def call_finished(self, s: Session) -> None:
        with self.cond:
            s.calls_running -= 1
            s.last_call = self.clock()

    def end(self, key: str) -> Session:
        """Close the open session of ``key`` without a reward: dropped (``no_reward``, or ``no_calls``)."""
        with self.cond:
            s = self.open_session(key)
            self._drop(s, "no_reward" if s.chat is not None and s.chat.records else "no_calls")
            self.cond.notify_all()
            return s

    def reward(self, key: str, reward: float | Sequence[float]) -> Session:
        """Reward the open session of ``key`` with one number (earned at its last call) or one per
        call. It then waits to be trained, or is dropped at once (``no_calls``; ``stale``).
        ``Refused`` (and nothing changes) for an unknown, closed or busy session or a bad reward."""
        with self.cond:
            s = self.open_session(key)
            if s.calls_running:
                raise Refused(f"session {s.sid} has a call still being answered: reward it once its calls are done",
                              409, "calls_running")
            records = list(s.chat.records) if s.chat is not None else []
            per_call = not isinstance(reward, (int, float))
            values = [float(reward)] if isinstance(reward, (int, float)) else [float(r) for r in reward]
            if not all(math.isfinite(v) for v in values):
                raise Refused("reward must be a finite number (or a list of them)", 400, "invalid_reward")
            if per_call and records and len(values) != len(records):
                raise Refused(f"rewards has {len(values)} values; session {s.sid} made {len(records)} calls "
                              "(one per call, in order)", 400, "invalid_reward")
            if not records:
                self._drop(s, "no_calls")
                self.cond.notify_all()
                return s
            s.trajectory = self._trajectory(s, records, values if per_call else None, values[0])
            self.rewarded += 1
            self.rewarded_tokens += sum(len(r.completion_ids) for r in records)
            s.chat = None
            s.state = "waiting"
            self._ready_counter += 1
            s.ready_order = self._ready_counter
            if self.bound.is_stale(s.start_version, self.version):
                self._drop(s, "stale")
            self.cond.notify_all()
            return s

    def _trajectory(self, s: Session, records: list[Any], per_call: list[float] | None, reward: float) -> Trajectory:
        trajs = assemble(records, reward, self.trajectory_mode)
        if per_call is not None:  # each trajectory's turns earn the rewards of its own calls
            for t in trajs:
                t.set_rewards([per_call[c] for c in t.info["calls"]])
                t.info["rewards_per_call"] = True
        main = trajs[-1]
        main.segments = trajs[:-1]
        settle_returns(main, self.turn_discount)
        main.info.update(episode_id=s.sid, session_id=s.sid, group=s.group, metadata=s.metadata,
                         num_calls=len(records), turn_finish_reasons=[r.finish_reason for r in records])
        if any(r.finish_reason == "abort" for r in records):
            main.info["aborted_calls"] = sum(r.finish_reason == "abort" for r in records)
        return main

    def expire(self) -> int:
        """Drop the open sessions whose reward did not come within ``ttl`` (none with a call
        running); returns how many."""
        now = self.clock()
        with self.cond:
            late = [s for s in self._by_key.values()
                    if s.state == "open" and not s.calls_running and now - s.last_call > self.ttl]
            for s in late:
                self._drop(s, "expired")
            if late:
                self.cond.notify_all()
            return len(late)

    # ------------------------------------------------------------------ versions and batches
    def set_version(self, version: int) -> None:
        """The trainer's weight version; rewarded sessions that became too stale are dropped."""
        with self.cond:
            self.version = int(version)
            for s in [s for s in self._by_key.values() if s.state == "waiting"]:
                if self.bound.is_stale(s.start_version, self.version):
                    self._drop(s, "stale")

    def _ready_units(self) -> list[list[Session]]:
        """Whole groups ready to train, oldest first (see the module docstring)."""
        named: dict[str, list[Session]] = {}
        single: list[Session] = []
        for s in self._by_key.values():
            if s.group is None:
                if s.state == "waiting":
                    single.append(s)
            else:
                named.setdefault(s.group, []).append(s)
        units = [[s] for s in single]
        for members in named.values():
            if all(s.state == "waiting" for s in members):
                units.append(members)
        return sorted(units, key=lambda u: max(s.ready_order for s in u))

    def ready(self) -> int:
        """Rewarded sessions that a batch could take now."""
        with self.cond:
            return sum(len(u) for u in self._ready_units())

    def take_batch(self, size: int | None = None) -> list[list[Trajectory]] | None:
        """The oldest whole groups of at least ``size`` (default ``batch_sessions``) rewarded
        sessions, as groups of trajectories (None: not enough ready); they count as trained."""
        size = self.batch_sessions if size is None else size
        with self.cond:
            units = self._ready_units()
            if sum(map(len, units)) < size:
                return None
            self._batches += 1
            taken: list[list[Session]] = []
            for unit in units:
                if sum(map(len, taken)) >= size:
                    break
                taken.append(unit)
            pool = [s for u in taken if len(u) == 1 for s in u]
            groups = [u for u in taken if len(u) > 1]
            if pool:
                groups.append(pool)
            out: list[list[Trajectory]] = []
            for i, members in enumerate(groups):
                gid = f"online-{self._batches}-{i}"
                trajs = []
                for s in members:
                    traj = s.trajectory
                    assert traj is not None
                    traj.group_id, traj.start_version = gid, s.start_version
                    for seg in traj.segments:
                        seg.group_id, seg.start_version = gid, s.start_version
                    trajs.append(traj)
                    s.state, s.trajectory = "trained", None
                    self._by_key.pop(s.key, None)
                    self.trained += 1
                out.append(trajs)
            return out

    # ------------------------------------------------------------------ end, checkpoints
    def close(self) -> None:
        """The run ends: no new sessions; the open and waiting ones are dropped (``run_ended``)."""
        with self.cond:
            self.closed = True
            for s in list(self._by_key.values()):
                self._drop(s, "run_ended")
            self.cond.notify_all()

    def state_dict(self) -> OnlineState:
        """The ledger and the rewarded sessions not trained yet (open ones cannot resume)."""
        with self.cond:
            waiting = [{"sid": s.sid, "group": s.group, "metadata": s.metadata, "ready_order": s.ready_order,
                        "opened_version": s.opened_version, "trajectory": s.trajectory.to_dict()}
                       for s in self._by_key.values() if s.state == "waiting" and s.trajectory is not None]
            return {"kind": "online", "opened": self.opened, "trained": self.trained, "dropped": dict(self.dropped),
                    "waiting": waiting, "serial": self._serial}

    def load_state_dict(self, state: OnlineState) -> None:
        """Restore :meth:`state_dict`: the waiting sessions come back (under new keys: they only
        wait to be trained); those that were open are dropped as ``restart``."""
        if not isinstance(state, dict) or state.get("kind") != "online":
            raise ValueError("invalid rollout state: not an online run's (this checkpoint is of another mode)")
        with self.cond:
            try:
                self.opened, self.trained = int(state["opened"]), int(state["trained"])
                self.dropped = Counter({str(k): int(v) for k, v in state["dropped"].items()})
                self._serial = int(state["serial"])
                self._by_key.clear()
                for w in state["waiting"]:
                    s = Session(sid=str(w["sid"]), key="sk-ses-" + secrets.token_urlsafe(24), group=w["group"],
                                metadata=dict(w["metadata"]), chat=None, opened_version=int(w["opened_version"]),
                                last_call=self.clock(), state="waiting",
                                trajectory=Trajectory.from_dict(w["trajectory"]), ready_order=int(w["ready_order"]))
                    self._by_key[s.key] = s
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"invalid online rollout state ({type(exc).__name__}: {exc})") from None
            self._ready_counter = max((s.ready_order for s in self._by_key.values()), default=0)
            lost = self.opened - self.trained - sum(self.dropped.values()) - len(self._by_key)
            if lost > 0:
                self.dropped["restart"] += lost
