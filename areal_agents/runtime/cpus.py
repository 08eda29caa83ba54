"""The cores this process may use: what every thread pool and worker count is sized from (no torch)."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """The cores this process may run on: its affinity mask (what ``taskset``, a batch scheduler or
    a container's cpuset allow), at least 1; ``os.cpu_count()`` where there is no mask."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
