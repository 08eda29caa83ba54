"""A runner that evaluates rewards in worker processes with a timeout.

:class:`RewardRunner` calls a reward in a separate process: a call
that hangs is killed after ``timeout`` seconds (its worker is replaced, so one hang costs
one timeout), and a crash, a non-number or a NaN becomes a counted failure
(:class:`RewardResult` with status ``timeout`` or ``reward_error``) instead of a stuck or
crashed run, as does a ``MemoryError`` past a worker's memory cap (``memory_mb`` of :class:`RewardRunner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import pickle
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from areal_agents.config.loader import user_files
from areal_agents.failures import function_location
from areal_agents.rewards.builtin import RewardFn, resolve_reward
from areal_agents.rewards.judge import Judge
from areal_agents.rewards.worker import Worker, check_not_in_worker, main_script_file
from areal_agents.runtime.cpus import usable_cpus

__all__ = [
    "RewardResult",
    "RewardRunner",
    "default_reward_workers",
    "default_runner",
    "get_default_runner",
    "set_default_runner",
]

_Job = tuple[str, Any, bytes]  # a call for a worker: label, function, pickled job


@dataclass
class RewardResult:
    """Outcome of one reward call: ``status`` is ``ok``, ``reward_error`` or ``timeout``."""

    value: float
    status: str = "ok"
    error: str = ""
    seconds: float = 0.0  # the call in its worker (a worker started for it included), not the wait for a free one
    judge_calls: int = 0  # 1 for a call of a :class:`~areal_agents.rewards.judge.Judge` (answered or not)
    values: list[float] | None = None  # a group reward's scores, one per reply (``value`` is their mean)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def default_reward_workers() -> int:
    """Reward worker processes when none are configured: one per CPU this process may use, at
    most 8 (rewards are short CPU-bound calls; more workers than cores only add memory)."""
    return max(1, min(usable_cpus(), 8))


class RewardRunner(contextlib.AbstractContextManager["RewardRunner"]):
    """Evaluate reward functions in up to ``max_workers`` worker processes (default
    :func:`default_reward_workers`), ``timeout`` s each; that many calls run at once.

    Thread-safe: :meth:`compute` (also ``runner(...)``) blocks the calling thread, so it can
    be used from ``env.step`` running in a worker thread; :meth:`acompute` is the asyncio
    form. Workers start on first use, each a fresh interpreter with this process's ``sys.path``
    that dies with this process (never a ``fork`` of a threaded process, and never a re-run of
    the ``__main__`` script). Functions must be picklable (defined at module top level of a
    module, a file loaded with ``imports=``, or the script);
    ``stats`` counts ``ok`` / ``reward_error`` / ``timeout`` outcomes. ``memory_mb`` caps each
    worker's address space (``RLIMIT_AS``; ``None`` for no cap): a reward that allocates past
    it fails with ``MemoryError`` (``reward_error``) and the worker keeps serving.
    """

    def __init__(self, timeout: float = 10.0, max_workers: int | None = None, memory_mb: int | None = 4096) -> None:
        if max_workers is None:
            max_workers = default_reward_workers()
        if timeout <= 0:
            raise ValueError(f"RewardRunner: timeout must be > 0 (got {timeout})")
        if max_workers < 1:
            raise ValueError(f"RewardRunner: max_workers must be >= 1 (got {max_workers})")
        if memory_mb is not None and memory_mb < 1:
            raise ValueError(f"RewardRunner: memory_mb must be >= 1 or None (got {memory_mb})")
        check_not_in_worker()
        self.memory_mb = memory_mb
        self.timeout = float(timeout)
        self.max_workers = int(max_workers)
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self._closed = False
        self.stats: dict[str, int] = {"ok": 0, "reward_error": 0, "timeout": 0}

    @classmethod
    def for_rollout(cls, rollout: Any) -> RewardRunner:
        """The runner a run's ``rollout`` config asks for (``reward_timeout``, ``reward_workers``)."""
        return cls(timeout=rollout.reward_timeout, max_workers=rollout.reward_workers)

    def _count(self, result: RewardResult) -> RewardResult:
        with self._lock:
            self.stats[result.status] = self.stats.get(result.status, 0) + 1
        return result

    def _prepare(self, fn: str | RewardFn, completion: str | list[str], row: dict[str, Any] | None) -> RewardResult | _Job:
        """The result when no worker is needed (``fn``'s :func:`fast_path` decides the call, or the call
        cannot be sent to a worker), else ``(label, function, pickled job)`` for a worker."""
        row = dict(row or {})
        with contextlib.suppress(Exception):  # the worker runs the call and reports what is wrong
            fast = getattr(resolve_reward(fn), "fast_path", None)
            value = None if fast is None else fast(completion, **row)
            if value is not None and math.isfinite(float(value)):
                return self._count(RewardResult(float(value), "ok", "", 0.0))
        label = f"reward {fn if isinstance(fn, str) else getattr(fn, '__name__', 'function')!r}"
        try:
            resolved = resolve_reward(fn)
            files = {**user_files(), **main_script_file(resolved)}
            return label, resolved, pickle.dumps((files, pickle.dumps((resolved, completion, row))))
        except Exception as exc:  # noqa: BLE001
            return self._count(RewardResult(0.0, "reward_error", f"{label}: cannot send the call to a worker: {exc}"))

    def _take_idle(self) -> Worker | None:
        """An idle worker that is still alive (a dead one is reaped), or None."""
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardRunner is closed")
            worker = self._idle.pop() if self._idle else None
        if worker is not None and not worker.alive():
            worker.kill()
            return None
        return worker

    def _died(self, worker: Worker, label: str, t0: float) -> RewardResult:
        code = worker.exit_code()
        worker.kill()
        return self._count(RewardResult(0.0, "reward_error", f"{label} ended its worker process (exit code {code})",
                                        time.monotonic() - t0))

    def compute(self, fn: str | RewardFn, completion: str | list[str], row: dict[str, Any] | None = None) -> RewardResult:
        """Run ``fn(completion, **row)`` (its fast path here, else in a worker); never raises for a bad reward.
        A group reward (:func:`~areal_agents.rewards.builtin.group_reward`) takes the group's replies as
        ``completion``; its scores are the result's ``values``."""
        call = self._prepare(fn, completion, row)
        return call if isinstance(call, RewardResult) else self._run_job(*call)

    __call__ = compute

    def _run_job(self, label: str, resolved: Any, job: bytes) -> RewardResult:
        with self._slots:  # a result's seconds: from here (a worker's start included), not the wait for a slot
            t0 = time.monotonic()
            worker = self._take_idle()
            if worker is None:
                worker = Worker(None if self.memory_mb is None else self.memory_mb * 2**20)
                if not worker.started():
                    return self._count(RewardResult(0.0, "reward_error", f"{label}: a worker process did not start "
                                                    f"(exit code {worker.exit_code()})", time.monotonic() - t0))
            try:
                worker.conn.send_bytes(job)
                answered = worker.conn.poll(self.timeout)
            except (EOFError, OSError):
                return self._died(worker, label, t0)
            return self._reply(worker, answered, label, resolved, t0)

    def _reply(self, worker: Worker, answered: bool, label: str, resolved: Any, t0: float) -> RewardResult:
        """The result of a call sent to ``worker``, once its reply came (``answered``) or the timeout passed."""
        judged = int(isinstance(resolved, Judge))
        if not answered:
            worker.kill()
            where = function_location(resolved)
            return self._count(RewardResult(0.0, "timeout", f"{label} did not return within {self.timeout:g} s"
                                            + (f" ({where})" if where else ""), time.monotonic() - t0, judged))
        try:
            ok, value = worker.conn.recv()
        except (EOFError, OSError):
            return self._died(worker, label, t0)
        with self._lock:  # the worker goes back to the idle ones
            if self._closed:
                worker.stop()
            else:
                self._idle.append(worker)
        dt = time.monotonic() - t0
        if ok and isinstance(value, list):  # a group reward's
            return self._count(RewardResult(sum(value) / max(1, len(value)), "ok", "", dt, judged, value))
        if ok:
            return self._count(RewardResult(float(value), "ok", "", dt, judged))
        return self._count(RewardResult(0.0, "reward_error", f"{label} {value}", dt, judged))

    async def acompute(self, fn: str | RewardFn, completion: str | list[str], row: dict[str, Any] | None = None) -> RewardResult:
        """:meth:`compute` for asyncio callers. With a started worker free, the call waits on
        the worker's socket in the event loop (no thread hand-off); otherwise (every worker
        busy, or one must start) it runs in a thread."""
        call = self._prepare(fn, completion, row)
        if isinstance(call, RewardResult):
            return call
        worker = self._free_worker()
        if worker is None:
            return await asyncio.to_thread(self._run_job, *call)
        label, resolved, job = call
        t0 = time.monotonic()  # the call's seconds: in the worker, not waiting for one
        try:
            worker.conn.send_bytes(job)
            answered = await _readable(worker.conn.fileno(), self.timeout)
        except (EOFError, OSError):
            return self._died(worker, label, t0)
        except asyncio.CancelledError:  # its reply may still come: the worker cannot serve another call
            worker.kill()
            raise
        else:
            return self._reply(worker, answered, label, resolved, t0)
        finally:
            self._slots.release()

    def _free_worker(self) -> Worker | None:
        """A started idle worker, with its slot taken; None when there is none."""
        if not self._slots.acquire(blocking=False):
            return None
        try:
            worker = self._take_idle()
        except RuntimeError:
            self._slots.release()
            raise
        if worker is None:
            self._slots.release()
        return worker

    def close(self) -> None:
        """Stop every worker; further calls raise."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _readable(fd: int, timeout: float) -> bool:
    """Wait in the event loop until ``fd`` has data; False after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: None if ready.done() else ready.set_result(None))
    try:
        await asyncio.wait_for(ready, timeout)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


_default: RewardRunner | None = None
_default_lock = threading.Lock()


def get_default_runner() -> RewardRunner:
    """The process-wide runner built-in envs use (created on first use: timeout 10 s,
    :func:`default_reward_workers` workers)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = RewardRunner()
        return _default


def set_default_runner(runner: RewardRunner | None) -> RewardRunner | None:
    """Replace the process-wide runner (e.g. with :meth:`RewardRunner.for_rollout`); returns the old one."""
    global _default
    with _default_lock:
        old, _default = _default, runner
    return old


@contextlib.contextmanager
def default_runner(runner: RewardRunner) -> Iterator[RewardRunner]:
    """``runner`` as the process-wide runner while inside; then the previous one is back and
    ``runner`` is closed (its worker processes stop)."""
    old = set_default_runner(runner)
    try:
        yield runner
    finally:
        set_default_runner(old)
        runner.close()
