"""A child process that ends when the process that started it is gone.

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits, so a child started
from a worker thread (a Ray actor method, a thread pool) outlives a parent that is SIGKILLed.
:func:`watch_parent` instead polls the parent's pid from a daemon thread of the child: once the
parent is gone (or the child was re-parented), the child gets ``signal`` (its own clean-up
runs), and is hard-exited ``grace`` seconds later if it is still alive.
"""

from __future__ import annotations

import contextlib
import os
import signal as _signal
import threading
import time

__all__ = ["PARENT_PID_ENV", "die_with_parent", "watch_parent", "watch_parent_from_env"]

PARENT_PID_ENV = "AREAL_AGENTS_PARENT_PID"  # a launched ``areal-agents`` process watches this pid


def die_with_parent(signal: int = _signal.SIGTERM) -> None:
    """Linux: have the kernel send ``signal`` to this process when the thread that started it
    ends (``PR_SET_PDEATHSIG``); a no-op where that is unavailable."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal)


def watch_parent(pid: int, *, interval: float = 0.5, signal: int = _signal.SIGTERM,
                 grace: float = 10.0) -> None:
    """Start a daemon thread that sends ``signal`` to this process when ``pid`` is gone."""
    def watch() -> None:
        while os.getppid() == pid:  # an ending process hands its children on before it is reaped: our parent runs
            time.sleep(interval)
        os.kill(os.getpid(), signal)
        time.sleep(grace)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name=f"watch-parent-{pid}").start()


def watch_parent_from_env() -> None:
    """:func:`watch_parent` on the pid in ``$AREAL_AGENTS_PARENT_PID`` (SIGKILL: a trainer rank
    whose launcher died has no one to finish with), when it is set."""
    if pid := os.environ.get(PARENT_PID_ENV):
        watch_parent(int(pid), signal=_signal.SIGKILL)
