"""The process's heap: the garbage collector kept off what a process sets up (:func:`quiet_setup`
while it imports and loads, :func:`freeze_setup` when its steady work starts), and freed memory
kept for reuse instead of handed back to the system at each free (:func:`keep_freed_memory`)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import platform
from collections.abc import Iterator, MutableMapping

__all__ = ["FREED_MEMORY_KEPT", "freeze_setup", "keep_freed_memory", "quiet_setup"]

FREED_MEMORY_KEPT = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 64 << 20}
"""glibc's allocator settings that :func:`keep_freed_memory` gives (bytes): blocks under 32 MiB come
from the heap, not from a mapping of their own, and up to 64 MiB freed at a heap's top stay there."""

_MALLOPT = {"MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_TRIM_THRESHOLD_": -1}  # glibc's M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


def keep_freed_memory(environ: MutableMapping[str, str] | None = None) -> bool:
    """Let glibc keep freed memory for the next allocation (:data:`FREED_MEMORY_KEPT`) in this
    process and, through ``environ`` (default ``os.environ``), in the processes it starts. Returns
    whether the settings were made: not where the user set either variable, nor off glibc.

    glibc's own thresholds start at 128 KiB and adapt, but not for the tensors an inference server
    makes and frees on its decode thread at every step (its own heap, not the main one): each of
    those blocks was mapped and unmapped again, and its pages zeroed by the kernel at first touch.
    The embedded server took 1.7 million page faults and 4 s of system time in 100 steps of the
    default ``math`` run (of its 14 s of CPU); 0.1 million and 0.8 s with these settings. Call it
    first thing (the command line does, as it does :func:`~areal_agents.runtime.cpus.yield_idle_threads`);
    a process reads the variables when it starts, this process takes them through ``mallopt``.
    """
    env = os.environ if environ is None else environ
    if any(name in env for name in _MALLOPT) or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    if not all(mallopt(_MALLOPT[name], value) for name, value in FREED_MEMORY_KEPT.items()):
        return False
    env.update({name: str(value) for name, value in FREED_MEMORY_KEPT.items()})  # for the processes it starts
    return True


@contextlib.contextmanager
def quiet_setup() -> Iterator[None]:
    """No collections inside; on leaving, what is alive is frozen and the collector is on again
    (if it was on before).

    For a bounded stretch of setup that only adds objects: importing torch and transformers
    (about 680,000 objects) or loading a model. With the collector on, the heap's growth sets off
    a full collection each time it grows by a quarter, and each one scans all that was imported
    before it: about 0.7 s of the 3.6 s that importing torch and transformers takes on 2 CPU
    cores. Nothing is collected on leaving (a collection of that heap costs ~0.35 s and finds a
    few MB of import-time cycles), so that garbage stays, frozen, for the process's life. Not for
    work that runs long and makes garbage (training, serving).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def freeze_setup(young: int | None = None) -> None:
    """Collect once, then freeze what is left alive (modules, a model, a tokenizer, a config);
    with ``young``, the youngest generation is collected every ``young`` net allocations (not 700).

    Call it when a process is done setting up and starts its steady work (a server serving, a
    trainer stepping, a rollout process taking calls): whatever setup left alive stays alive, so
    the full collections that the steady work's short-lived objects set off need not scan it
    again. In a trainer that has imported torch and transformers a full collection scans
    hundreds of thousands of objects: about 0.1 s, paid a few times per eval of 500 episodes.
    Objects created after the call are collected as usual.

    ``young`` is for work that makes many objects living a few milliseconds and holds no large
    buffers, so that cyclic garbage waiting longer costs a few MB: a rollout process's episodes
    (HTTP, JSON, token lists) set off ~3,000 young collections in the default ``math`` run, 1.5 s
    of its 30, with the default 700; 0.4 s with 50,000.
    """
    gc.collect()
    gc.freeze()
    if young is not None:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young, middle, old)
