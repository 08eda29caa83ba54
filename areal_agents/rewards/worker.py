"""Reward worker processes: a fresh interpreter each, tied to the life of the process that started it.

Used by :class:`~areal_agents.rewards.runner.RewardRunner`; :func:`check_not_in_worker` also by the CLI
and the preflight check. A worker is ``python -c <bootstrap>`` with the parent's
``sys.path``, talking over a socket pair. It never imports the parent's ``__main__`` (so a
script that starts a run without an ``if __name__ == "__main__":`` guard is not run again),
except to load a reward function defined there; if that script then starts a run, it stops
with a message saying to add the guard. A worker dies with its parent: ``PR_SET_PDEATHSIG``
(SIGKILL) on Linux, armed from a spawner thread that lives as long as the process, plus a
thread polling the parent's pid elsewhere; at interpreter exit the parent kills what is left.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import math
import numbers
import os
import pickle
import resource
import runpy
import signal
import socket
import subprocess
import sys
import traceback
import types
import weakref
from multiprocessing.connection import Connection
from typing import Any

from areal_agents.config.loader import import_user_module
from areal_agents.failures import function_location
from areal_agents.runtime.lifeline import die_with_parent, watch_parent

__all__ = ["Worker", "check_not_in_worker", "main_script_file"]  # what the runner and the CLI use

_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from areal_agents.rewards.worker import worker_entry; worker_entry(*sys.argv[2:])")

_READY = b"ready"
_STARTUP_TIMEOUT = 120.0  # seconds for a worker to start, on a machine under load
_LOADING_MAIN: str | None = None  # the parent's script, while a worker imports it for a reward


def check_not_in_worker() -> None:
    """Refuse to start a run (or reward workers) while a reward worker imports the parent's script
    for a reward defined there: the script has no ``__main__`` guard and would run again."""
    if _LOADING_MAIN is not None:
        raise RuntimeError(f"{os.path.basename(_LOADING_MAIN)} starts a run when imported, and a reward worker "
                           'imports it to load a reward defined there: put the run under `if __name__ == "__main__":` '
                           "(or move the reward into a module)")


class BadValue(Exception):
    """A reward returned something that is not a finite number."""


def check_value(value: Any) -> float:
    """``value`` as a finite float; numbers of any kind (numpy too) but not bools or strings."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadValue(f"returned {type(value).__name__} {value!r:.60}, not a number")
    result = float(value)
    if not math.isfinite(result):
        raise BadValue(f"returned {result}, not a finite number")
    return result


def check_values(value: Any, n: int) -> list[float]:
    """A group reward's ``value`` as ``n`` finite floats (one per reply of the group)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != n:
        raise BadValue(f"returned {type(value).__name__} {value!r:.60}, not {n} numbers (one per reply of the group)")
    return [check_value(v) for v in value]


def describe_failure(fn: Any, exc: BaseException) -> str:
    """What went wrong in ``fn`` (``returned str ..., not a number`` or ``raised Type: msg``)
    and where: the innermost line of ``fn``'s file in the traceback, else where ``fn`` is defined."""
    where = function_location(fn)
    code = getattr(fn, "__code__", None)
    if not isinstance(exc, BadValue) and code is not None:
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == code.co_filename]
        if lines:
            where = f"{where.rsplit(':', 1)[0] if where else '?'}:{lines[-1]}"
    what = str(exc) if isinstance(exc, BadValue) else f"raised {type(exc).__name__}: {exc}".rstrip(": ")
    return what + (f" ({where})" if where else "")


def _limit_memory(memory_bytes: int) -> None:
    """Cap this process's address space at ``memory_bytes`` (soft and hard limit; Linux/macOS)."""
    if memory_bytes <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _load_main(path: str) -> None:
    """Import the parent's script as ``__main__`` (guarded code does not run), for a reward defined there."""
    global _LOADING_MAIN
    if getattr(sys.modules.get("__mp_main__"), "__file__", None) == path:
        return
    _LOADING_MAIN = path
    try:
        namespace = runpy.run_path(path, run_name="__mp_main__")
    finally:
        _LOADING_MAIN = None
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(namespace)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _import_files(files: dict[str, str]) -> None:
    """Import the user's ``.py`` files (``imports=``, or the script) a pickled reward may live in."""
    for name, path in files.items():
        if name == "__main__":
            _load_main(path)
        elif name not in sys.modules:
            import_user_module(path)


def _serve(conn: Connection) -> None:
    """Receive ``(files, pickled (fn, completion, row))``, send ``(ok, value or error text)`` (a group
    reward's ``completion`` is the group's replies, its value a list of scores)."""
    while True:
        try:
            job = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not job:
            return
        fn = None
        try:
            files, payload = pickle.loads(job)
            _import_files(files)
            fn, completion, row = pickle.loads(payload)
            if getattr(fn, "group", False) is True and isinstance(completion, str):
                raise BadValue("is a group reward (it scores a group's replies together): name it in "
                               "rollout.group_reward, not as an env's reward")
            value = fn(completion, **row)
            reply: tuple[bool, Any] = (True, check_values(value, len(completion)) if getattr(fn, "group", False) is True
                                       else check_value(value))
        except BaseException as exc:  # noqa: BLE001 - everything becomes a recorded failure
            reply = (False, describe_failure(fn, exc) if fn is not None
                     else f"could not be loaded in a worker: {type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:
            return


def worker_entry(fd: str, parent: str, memory_bytes: str) -> None:
    """The worker's main: called by the bootstrap with the socket fd, the parent's pid and the cap."""
    # end this process when the parent ends: the kernel's parent-death signal, and a watcher thread
    die_with_parent(signal.SIGKILL)  # Linux only; a no-op elsewhere
    if os.getppid() != int(parent):  # the parent ended before the signal was armed
        os._exit(1)
    watch_parent(int(parent), signal=signal.SIGKILL)
    _limit_memory(int(memory_bytes))
    conn = Connection(int(fd))
    conn.send_bytes(_READY)  # start-up (an interpreter and imports) does not count against reward timeouts
    _serve(conn)


# -- the parent side ----------------------------------------------------------------------

# Popen runs here: the parent-death signal fires when the *thread* that started the child ends,
# and this one lives as long as the process (request threads come and go).
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-spawner")
_live: weakref.WeakSet[Worker] = weakref.WeakSet()


class Worker:
    """One worker process and the parent's end of its socket."""

    def __init__(self, memory_bytes: int | None = None) -> None:
        ours, theirs = socket.socketpair()
        self.conn = Connection(ours.detach())
        with theirs:  # the worker's end, closed here once the worker holds it
            fd = theirs.fileno()
            cmd = [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(fd), str(os.getpid()), str(memory_bytes or 0)]
            self.proc = _spawner.submit(subprocess.Popen, cmd, pass_fds=(fd,), stdin=subprocess.DEVNULL,
                                        start_new_session=True).result()
        _live.add(self)

    def started(self) -> bool:
        """Wait for the worker's ready message; False (the worker is killed) if it never came."""
        with contextlib.suppress(EOFError, OSError):
            if self.conn.poll(_STARTUP_TIMEOUT) and self.conn.recv_bytes() == _READY:
                return True
        self.kill()
        return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_code(self, timeout: float = 5.0) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        self.proc.kill()  # a no-op once the process has ended
        self.exit_code()
        self.conn.close()
        _live.discard(self)

    def __del__(self) -> None:  # a runner dropped without close(): end and reap the process
        if getattr(self, "proc", None) is not None:
            self.kill()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send_bytes(b"")
        self.exit_code(2.0)  # a worker still running after that is killed
        self.kill()


def main_script_file(fn: Any) -> dict[str, str]:
    """``{"__main__": path}`` when ``fn`` is defined in the parent's script, else ``{}``."""
    if getattr(fn, "__module__", None) != "__main__":
        return {}
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return {"__main__": os.path.abspath(path)} if path else {}


@atexit.register
def _kill_all() -> None:  # nothing outlives the interpreter, whether or not its runner was closed
    for worker in list(_live):
        worker.kill()
