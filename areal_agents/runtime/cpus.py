"""The cores this process may use: what every thread pool and worker count is sized from, and how
idle threads wait for work (no torch)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["OPENMP_SPIN_COUNT", "server_threads", "trainer_threads", "usable_cpus", "yield_idle_threads"]

OPENMP_SPIN_COUNT = 3000
"""How long an idle OpenMP thread spins before it sleeps (``GOMP_SPINCOUNT``, in spin-loop
iterations: a few microseconds). libgomp's own default, 300,000, keeps every idle thread of a
parallel region burning its core for about a millisecond at each barrier: on a machine busy with
other processes those spins take the cores that the thread doing the work needs (60 SFT steps of
``math`` beside one busy process per core: 2.7-3.3x their time alone; 2.1x with 3,000, the same
time alone; ``benchmarks/bench_contention.py``)."""


def usable_cpus() -> int:
    """The cores this process may run on: its affinity mask (what ``taskset``, a batch scheduler or
    a container's cpuset allow), at least 1; ``os.cpu_count()`` where there is no mask."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def server_threads(num_servers: int, cpus: int | None = None) -> int:
    """The threads of each of ``num_servers`` embedded CPU servers sharing ``cpus`` cores (default:
    :func:`usable_cpus`) with the trainer: an equal share each, ``cpus // (num_servers + 1)``, at least one."""
    return max(1, (cpus or usable_cpus()) // (num_servers + 1))


def trainer_threads(num_servers: int, cpus: int | None = None) -> int:
    """The trainer's threads on ``cpus`` cores (default: :func:`usable_cpus`) shared with
    ``num_servers`` embedded CPU servers (:func:`server_threads` each): the cores they leave, at
    least one (oversubscribed OpenMP pools busy-wait)."""
    cpus = cpus or usable_cpus()
    return max(1, cpus - num_servers * server_threads(num_servers, cpus))


def yield_idle_threads(environ: MutableMapping[str, str] | None = None) -> None:
    """Let idle OpenMP threads sleep soon (:data:`OPENMP_SPIN_COUNT`) unless the user chose how
    they wait (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` set). OpenMP reads this once, when torch
    loads it: call it before torch is imported (the command line does, first thing); the servers
    and ranks a command starts inherit it."""
    env = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        env["GOMP_SPINCOUNT"] = str(OPENMP_SPIN_COUNT)
