"""Shared checks of the rollout tests: threads left behind."""

from __future__ import annotations

import threading
import time

__all__ = ["other_threads", "threads_drained"]


def other_threads() -> int:
    """Threads besides the env-call pool's (reused across tests; idle ones leave after 1 s)."""
    return sum(1 for t in threading.enumerate() if t.name != "env-call")


def threads_drained(threads0: int, timeout: float = 3.0) -> bool:
    """No thread left beyond ``threads0``, and the env-call pool empty once its idle threads left."""
    deadline = time.monotonic() + timeout
    while any(t.name == "env-call" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return other_threads() == threads0 and not any(t.name == "env-call" for t in threading.enumerate())
