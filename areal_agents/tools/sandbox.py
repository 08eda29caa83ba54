"""Run untrusted Python (model-written code) in a locked-down child process.

:func:`run_python` starts a fresh interpreter (``python -I -S``: no site-packages unless asked)
that, before running the code as ``main.py`` in that same interpreter (no second start-up):

* enters new mount, network and PID namespaces (``unshare(2)``; as a normal user inside a
  new user namespace): the network has only a downed loopback, so connections fail with
  "Network is unreachable", and the child sees only its own processes;
* hides every top-level directory but the system ones of :data:`VISIBLE_ROOTS` (``/usr``,
  ``/lib``, ``/bin``, ``/dev``...) behind empty tmpfs mounts, wherever the host keeps its
  projects, homes and data (``/home``, ``/root``, ``/work``, ``/srv``, a CI checkout...),
  bind-mounting back only the Python installation, ``/etc/ld.so.cache`` and its own temp dir;
* when started as root, drops to an unused uid of its own (one per run, from
  :data:`SANDBOX_UID_BASE`), so ``RLIMIT_NPROC`` counts only that run's processes (a fork
  bomb cannot starve concurrent sandboxes) and no host file is readable by ownership;
* sets ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``
  (files and output), ``RLIMIT_NOFILE`` and no core dumps;
* drops every capability and sets ``no_new_privs`` (no setuid program gives any back);
* runs in a fresh temp dir (deleted afterwards) with a minimal environment.

A wall-clock timeout kills the child's whole process group (and with it the PID namespace).
If namespaces are unavailable the code still runs with the resource limits, and
:attr:`SandboxResult.isolation` says what was not isolated.
"""

from __future__ import annotations

import contextlib
import itertools
import marshal
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = ["VISIBLE_ROOTS", "SandboxResult", "run_python"]

VISIBLE_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/dev", "/proc")
"""The top-level directories left visible (system files any user may read); all others are hidden."""
SANDBOX_UID_BASE = 1_500_000_000
_runs = itertools.count()

# Runs as the child's first code (python -I -S -c); argv[1] is its config, marshalled as hex
# (marshal is built in: json would import re, a third of this interpreter's start-up).
_BOOT = r"""
import ctypes, marshal, os, resource, sys
cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
def call(name, *args):
    if getattr(libc, name)(*args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, name + ": " + os.strerror(e))
def note(key, value):
    data = marshal.dumps((key, value))
    os.write(cfg["status_fd"], len(data).to_bytes(4, "little") + data)
uid, gid = os.getuid(), os.getgid()
NS, NET, USER, PID = 0x20000, 0x40000000, 0x10000000, 0x20000000
isolated = False
if cfg["isolate"]:
    try:
        call("unshare", NS | NET | PID | (0 if uid == 0 else USER))
        if uid != 0:
            for name, text in (("setgroups", "deny"), ("uid_map", "0 %d 1" % uid), ("gid_map", "0 %d 1" % gid)):
                with open("/proc/self/" + name, "w") as fh:
                    fh.write(text)
        call("mount", None, b"/", None, 16384 | (1 << 18), None)
        keeps = [p for p in cfg["keep"] if os.path.exists(p)]
        fds = {p: os.open(p, os.O_PATH) for p in keeps}
        for root in cfg["hide"]:  # directories, not symlinks (_hidden_roots)
            call("mount", b"tmpfs", root.encode(), b"tmpfs", 2 | 4, b"mode=755,size=1m")
            for p in keeps:
                if p == root or p.startswith(root.rstrip("/") + "/"):
                    src = "/proc/self/fd/%d" % fds[p]
                    if os.path.isdir(src):
                        os.makedirs(p, exist_ok=True)
                    else:
                        os.makedirs(os.path.dirname(p), exist_ok=True)
                        open(p, "w").close()
                    call("mount", src.encode(), p.encode(), None, 4096 | 16384, None)
        for fd in fds.values():
            os.close(fd)
        isolated = True
    except OSError as exc:
        note("isolation_error", str(exc))
pid = os.fork() if isolated else 0
if pid == 0:
    if isolated:
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG = SIGKILL
        try:
            call("mount", b"proc", b"/proc", b"proc", 2 | 4 | 8, None)
            note("proc", True)
        except OSError as exc:
            note("isolation_error", "proc: " + str(exc))
        if uid != 0:
            call("unshare", USER | NS)  # lock the mounts above
    note("isolated", isolated)
    os.close(cfg["status_fd"])
    for name, value in cfg["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if uid == 0 and (isolated or cfg["drop_ok"]):
        os.setgroups([])
        os.setgid(cfg["drop_to"])
        os.setuid(cfg["drop_to"])
    if isolated:  # the namespaces' capabilities end here (no exec clears them)
        call("capset", (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)())
        call("prctl", 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid program gives any back
    os.chdir(cfg["cwd"])
    os.environ.clear()
    os.environ.update(cfg["env"])
    if cfg["site"]:
        import site
        site.main()
    del libc, call, note
    sys.argv = ["main.py"]
    with open("main.py", encoding="utf-8") as fh:
        source = fh.read()
    try:
        exec(compile(source, "main.py", "exec"), {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException as exc:  # the interpreter's own report of an uncaught exception, minus this frame
        exc = exc.with_traceback(exc.__traceback__.tb_next)
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
        if isinstance(exc, KeyboardInterrupt):  # ends by SIGINT, as the interpreter does
            import signal
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            sys.exit(130)  # still here: the PID namespace's init ignores it
        sys.exit(1)
    sys.exit(0)
os.close(cfg["status_fd"])
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])  # EINTR is retried (PEP 475)
os._exit(code if code >= 0 else 128 - code)
"""


@dataclass
class SandboxResult:
    """What the sandboxed code did.

    ``exit_code`` is the code's exit status; ``128 + N`` means it was killed by signal N
    (e.g. 137 = SIGKILL, 152 = SIGXCPU after the CPU limit, 153 = SIGXFSZ after the file
    size limit). ``timed_out`` is true when the wall-clock limit killed it.
    ``isolation`` lists what was in force (``namespaces``: network, PID and file hiding;
    ``proc``: a private ``/proc``; ``drop_privileges``: root ran it under a fresh uid);
    ``isolation_error`` says why something was not available.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    duration_s: float
    truncated: bool = False
    isolation: dict[str, bool] = field(default_factory=dict)
    isolation_error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def _keep_paths(workdir: str, extra: tuple[str, ...]) -> list[str]:
    pythons = (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)))
    return sorted({workdir, "/etc/ld.so.cache", *extra, *map(os.path.realpath, pythons)})


def _hidden_roots() -> list[str]:
    """Every top-level directory (not a symlink) outside :data:`VISIBLE_ROOTS`."""
    roots = (os.path.join("/", name) for name in sorted(os.listdir("/")))
    return [r for r in roots if r not in VISIBLE_ROOTS and os.path.isdir(r) and not os.path.islink(r)]


def _traversable_by_others(path: str) -> bool:
    """Whether a user other than the owner can reach and run ``path`` (every parent o+x)."""
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & 0o001 for p in (real, *real.parents))


def _notes(data: bytes) -> list[tuple[str, Any]]:
    """The boot script's ``(key, value)`` notes: each marshalled, after its length (4 bytes)."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos:pos + 4], "little")
        out.append(marshal.loads(data[pos + 4:pos + 4 + size]))
        pos += 4 + size
    return out


def _read(fh: IO[bytes], limit: int) -> tuple[str, bool]:
    fh.seek(0)
    data = fh.read(limit + 1)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def _boot_config(workdir: str, run_uid: int, status_fd: int, *, isolate: bool, keep_paths: tuple[str, ...],
                 env: dict[str, str] | None, timeout_s: float, memory_mb: int, max_procs: int,
                 max_file_mb: int, site_packages: bool) -> dict[str, Any]:
    """What the child's boot script is told: isolation, visible paths, the uid to drop to, limits."""
    return {
        "isolate": isolate,
        "keep": _keep_paths(workdir, keep_paths),
        "hide": _hidden_roots(),
        "cwd": workdir,
        "drop_to": run_uid,
        "drop_ok": _traversable_by_others(sys.executable),
        "site": site_packages,
        "status_fd": status_fd,
        "env": env if env is not None else {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": workdir,
        },
        "limits": {
            "RLIMIT_AS": memory_mb * 1024 * 1024,
            "RLIMIT_CPU": int(math.ceil(timeout_s)) + 1,
            "RLIMIT_NPROC": max_procs,
            "RLIMIT_FSIZE": max_file_mb * 1024 * 1024,
            "RLIMIT_NOFILE": 256,
            "RLIMIT_CORE": 0,
        },
    }


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_procs: int = 32,
    max_file_mb: int = 16,
    max_output_chars: int = 16_000,
    isolate: bool = True,
    keep_paths: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    site_packages: bool = False,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a sandboxed interpreter (see the module docstring).

    ``timeout_s`` is wall-clock (``RLIMIT_CPU`` is its ceiling + 1 s), ``memory_mb`` the
    address-space limit, ``max_procs`` the process limit, ``max_file_mb`` the largest file
    (or output) it may write; stdout/stderr are cut to ``max_output_chars``. ``keep_paths``
    are extra host paths to leave visible; ``env`` replaces the minimal environment.
    ``site_packages`` makes the installed packages importable (``import site`` first: ~35 ms a
    call); without it the code has the standard library only.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_procs < 1:
        raise ValueError("run_python: timeout_s, memory_mb and max_procs must be positive")
    is_root = os.getuid() == 0
    # a uid no account uses, distinct for every run of this process (and across processes)
    run_uid = SANDBOX_UID_BASE + (os.getpid() * 65_536 + next(_runs)) % 500_000_000
    with (tempfile.TemporaryDirectory(prefix="areal-sandbox-", ignore_cleanup_errors=True) as workdir,
          tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err):
        main_py = Path(workdir, "main.py")
        main_py.write_text(code, encoding="utf-8")
        if is_root:
            os.chown(workdir, run_uid, run_uid)
            os.chown(main_py, run_uid, run_uid)
        read_fd, write_fd = os.pipe()
        cfg = _boot_config(workdir, run_uid, write_fd, isolate=isolate, keep_paths=keep_paths, env=env,
                           timeout_s=timeout_s, memory_mb=memory_mb, max_procs=max_procs, max_file_mb=max_file_mb,
                           site_packages=site_packages)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _BOOT, marshal.dumps(cfg).hex()],
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=workdir, env={"LANG": "C.UTF-8"},
            start_new_session=True, pass_fds=(write_fd,),
        )
        os.close(write_fd)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        duration = time.monotonic() - t0
        with os.fdopen(read_fd, "rb") as status_pipe:
            notes = dict(_notes(status_pipe.read()))
        stdout, cut_out = _read(out, max_output_chars)
        stderr, cut_err = _read(err, max_output_chars)
        code_ = proc.returncode
        isolated = bool(notes.get("isolated"))
        return SandboxResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=code_ if code_ >= 0 else 128 - code_,
            timed_out=timed_out,
            duration_s=duration,
            truncated=cut_out or cut_err,
            isolation={
                "namespaces": isolated,
                "proc": bool(notes.get("proc", False)),
                "drop_privileges": is_root and (isolated or bool(cfg["drop_ok"])),
            },
            isolation_error=str(notes.get("isolation_error", "")),
        )
