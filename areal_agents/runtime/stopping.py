"""Ctrl-C and SIGTERM end a command in any phase, within seconds, leaving no processes.

Inside :func:`stop_on_signals` either signal raises in the main thread (``KeyboardInterrupt``,
or :class:`Terminated` for SIGTERM), so the command unwinds: context managers stop the
servers and the rollout process, a checkpoint may be saved. Unwinding can itself wait on
something that never ends (an agent that ignores its cancellation, a thread stuck in a
call), so each signal also arms :func:`exit_soon`: if the process is still alive
``HARD_EXIT_AFTER`` seconds later, the :func:`on_hard_exit` hooks run (the launcher's kills
its servers' process groups) and the process exits at once. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["HARD_EXIT_AFTER", "Terminated", "exit_soon", "interrupt", "on_hard_exit", "stop_on_signals"]

HARD_EXIT_AFTER = 10.0
"""Seconds an interrupted command has to unwind before the process is ended outright."""

_HOOKS: list[Callable[[], None]] = []
_armed = threading.Event()


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM (a ``KeyboardInterrupt``, so it unwinds the same way)."""


def on_hard_exit(hook: Callable[[], None]) -> None:
    """Run ``hook()`` (quick, no waiting) before :func:`exit_soon` ends the process."""
    _HOOKS.append(hook)


def exit_soon(code: int, grace: float = HARD_EXIT_AFTER) -> None:
    """End the process with ``code`` in ``grace`` seconds unless it has exited by then (armed once)."""
    if _armed.is_set():
        return
    _armed.set()

    def fire() -> None:
        time.sleep(grace)
        for hook in _HOOKS:
            with contextlib.suppress(Exception):
                hook()
        os._exit(code)

    threading.Thread(target=fire, daemon=True, name="exit-soon").start()


def interrupt(signum: int, frame: FrameType | None = None) -> None:
    """The signal handler: arm :func:`exit_soon` and raise in the main thread."""
    if signum == signal.SIGTERM:
        exit_soon(128 + signum)
        raise Terminated(f"terminated (signal {signum})")
    exit_soon(130)
    raise KeyboardInterrupt


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside (main thread only, else a no-op), SIGINT and SIGTERM call :func:`interrupt`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
