"""Sync calls on reusable daemon threads: :func:`run_in_thread` (env calls from the event loop)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["run_in_thread"]


def _deliver(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if not fut.done():
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


class _ElasticThreads:
    """Daemon worker threads that are reused, and added whenever none is idle (see :func:`run_in_thread`).

    Reuse saves a thread start per env call (under GIL pressure, starting a thread stalls the
    event loop that asked for it). Idle threads are reused in turn, the longest idle first, so
    that under steady load none sits idle long enough to leave, and the next burst of env calls
    finds the threads the last one started; a thread idle for ``idle_s`` seconds leaves.
    """

    def __init__(self, idle_s: float = 1.0) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: collections.deque[queue.SimpleQueue[Callable[[], None]]] = collections.deque()  # their inboxes

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.popleft() if self._idle else None
        if inbox is None:
            threading.Thread(target=self._work, args=(job,), name="env-call", daemon=True).start()
        else:
            inbox.put(job)

    def _work(self, job: Callable[[], None]) -> None:
        inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        while True:
            job()
            with self._lock:
                self._idle.append(inbox)
            try:
                job = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # nobody took this thread: leave
                        self._idle.remove(inbox)
                        return
                job = inbox.get()  # taken just as the wait ended: its job is on the way


_THREADS = _ElasticThreads()


async def run_in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``await fn(*args, **kwargs)`` run on a worker thread (like ``asyncio.to_thread``).

    Unlike ``asyncio.to_thread`` it does not use the event loop's bounded default pool: a
    sync env call that never returns parks one daemon thread of its own, so it can neither
    starve other episodes of threads nor hold up the loop's shutdown (threads are reused
    while they are free, and added when none is). A ``BaseException`` such as
    ``SystemExit`` raised by ``fn`` arrives as a ``RuntimeError``, so it cannot stop the
    caller's event loop.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    ctx = contextvars.copy_context()

    def work() -> None:
        try:
            outcome: tuple[bool, Any] = (True, ctx.run(fn, *args, **kwargs))
        except Exception as exc:
            outcome = (False, exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit etc. must not reach the loop
            outcome = (False, RuntimeError(f"{type(exc).__name__} raised in {getattr(fn, '__name__', fn)}: {exc}"))
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for the result any more
            loop.call_soon_threadsafe(_deliver, fut, *outcome)

    _THREADS.submit(work)
    return await fut
