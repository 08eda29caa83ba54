"""Start inference servers as subprocesses: the embedded server or SGLang.

Each server runs in its own process group on a loopback port and is waited for until
``GET /health`` answers; closing a handle kills the whole group, and a failed launch
closes every server it had started, so no process outlives its owner. On Linux the
children launched from the main thread get SIGTERM if the launching process dies, and every
embedded server watches its launcher's pid (``--parent-pid``), so it also ends when it was
launched from another thread (a Ray actor's) and its launcher is SIGKILLed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.failures import UserError
from areal_agents.inference.scoring import is_reward_model
from areal_agents.inference.sglang_version import sglang_version_problem
from areal_agents.runtime.cpus import server_threads
from areal_agents.runtime.lifeline import die_with_parent
from areal_agents.runtime.stopping import on_hard_exit

__all__ = ["JUDGE_URL_ENV", "LaunchError", "ServerGroup", "ServerHandle", "add_serve_args", "check_sglang",
           "embedded_command", "free_port", "inference_servers", "judge_server", "launch_servers", "starting_servers",
           "sglang_command"]  # fmt: skip

_SERVING = re.compile(r"serving on http://([^\s:]+):(\d+)")
_LIVE: set[ServerHandle] = set()


class LaunchError(UserError, RuntimeError):
    """A server did not come up; the message ends with the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_sglang() -> None:
    """Raise :class:`ConfigError` unless sglang >= 0.4.9.post2 is installed."""
    if (problem := sglang_version_problem()) is not None:
        raise ConfigError("inference.backend", problem)


def sglang_command(cfg: ExperimentConfig, model_path: str | os.PathLike[str], port: int, server_index: int = 0) -> list[str]:
    """``python -m sglang.launch_server ...`` for server ``server_index`` (GPUs from index * tp)."""
    tp, dtype = int(cfg.sglang.tp_size), str(cfg.sglang.dtype)
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_path),
        "--host", str(cfg.inference.host),
        "--port", str(int(port)),
        "--tp-size", str(tp),
        "--dtype", str(cfg.actor.dtype) if dtype.startswith("${") else dtype,  # ${actor.dtype} unresolved: the actor's
        "--mem-fraction-static", str(cfg.sglang.mem_fraction_static),
        "--random-seed", str(int(cfg.sglang.random_seed) + server_index),
    ]  # fmt: skip
    if server_index:
        cmd += ["--base-gpu-id", str(server_index * tp)]
    if is_reward_model(model_path):  # served for /classify, as SGLang serves reward models
        cmd.append("--is-embedding")
    return cmd + [str(a) for a in cfg.sglang.extra_args]


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The embedded server's command-line flags (``python -m areal_agents.inference.server``,
    ``areal-agents serve``, :func:`embedded_command`)."""
    parser.add_argument("--model", help="HF model dir (default: the tiny default model for --env)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000, help="port (0 picks a free one)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--max-batch-size", type=int, default=256, help="sequences decoded together")
    parser.add_argument("--weight-version", default="0", help="initial weight version")
    parser.add_argument("--lora-paths", nargs="*", type=_lora_path, action="extend", metavar="NAME=DIR",
                        help="LoRA adapters (PEFT dirs) to load at start, served under NAME (lora_path of /generate)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit once this process (the launcher) is gone (polled every 0.5 s)")
    return parser


def _lora_path(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIR")
    return name, path


def embedded_command(cfg: ExperimentConfig, model_path: str | os.PathLike[str], port: int = 0,
                     parent_pid: int | None = None) -> list[str]:
    """``python -m areal_agents.inference.server ...`` with the config's host, device and batch size
    (and ``--parent-pid``: the server exits once that process is gone)."""
    watch = ["--parent-pid", str(int(parent_pid))] if parent_pid is not None else []
    return [
        sys.executable, "-m", "areal_agents.inference.server",
        "--model", str(model_path),
        "--host", str(cfg.inference.host),
        "--port", str(int(port)),
        "--device", str(cfg.inference.device),
        "--max-batch-size", str(int(cfg.inference.max_batch_size)),
        *watch,
    ]  # fmt: skip


@dataclass(eq=False)
class ServerHandle:
    """One server subprocess; ``address`` is ``host:port``."""

    address: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int = 0  # the log is appended to: this launch's output starts here
    _closed: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def close(self, timeout: float = 10.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left after ``timeout``."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
                self.process.wait(timeout=wait)
                # the leader is gone; make sure no child of it survives either
                os.killpg(self.process.pid, signal.SIGKILL)
            except subprocess.TimeoutExpired:
                continue
            except (ProcessLookupError, PermissionError):
                pass
            break


class ServerGroup(list[ServerHandle], contextlib.AbstractContextManager["ServerGroup"]):
    """The servers of one launch; a context manager that closes them all."""

    def __init__(self, backend: str = "embedded", deadline: float = float("inf")) -> None:
        super().__init__()
        self.backend, self.deadline, self.ready = backend, deadline, False

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self]

    def wait_ready(self) -> list[str]:
        """Wait until every server has announced its address (embedded) and answers ``/health``
        with 200, by the launch's deadline; return the addresses. Raises :class:`LaunchError`
        (after closing them all) otherwise."""
        from areal_agents.inference.control import ControlError, wait_healthy

        try:
            for handle in () if self.ready else self:
                if self.backend == "embedded":
                    handle.address = _wait_announced(handle, self.deadline)
                try:
                    wait_healthy(handle.address, timeout=max(1.0, self.deadline - time.monotonic()))
                except ControlError as exc:
                    raise LaunchError(f"{exc}:\n{handle.log_tail()}") from None
        except BaseException:
            self.close()
            raise
        self.ready = True
        return self.addresses

    def close(self) -> None:
        for handle in self:
            handle.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start(cmd: list[str], log_path: Path, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    # The parent-death signal fires when the *thread* that forked exits, so only the main
    # thread (which lives as long as the process) arms it.
    arm = sys.platform == "linux" and threading.current_thread() is threading.main_thread()
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})}, preexec_fn=die_with_parent if arm else None,
        )  # fmt: skip


def _wait_announced(handle: ServerHandle, deadline: float) -> str:
    """Wait for the embedded server's ``serving on`` line; return ``host:port``."""
    while time.monotonic() < deadline:
        with open(handle.log_path, "rb") as fh:
            fh.seek(handle.log_offset)
            match = _SERVING.search(fh.read().decode(errors="replace"))
        if match:
            return f"{match.group(1)}:{match.group(2)}"
        if not handle.alive:
            raise LaunchError(f"server exited with code {handle.process.returncode}:\n{handle.log_tail()}")
        time.sleep(0.05)
    raise LaunchError(f"server did not announce its address in time:\n{handle.log_tail()}")


def launch_servers(
    cfg: ExperimentConfig, model_path: str | os.PathLike[str], n: int | None = None, *, log_dir: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None, ports: list[int] | None = None, wait: bool = True,
) -> ServerGroup:  # fmt: skip
    """Start ``n`` (default ``cfg.inference.num_servers``) servers of ``cfg.inference.backend``
    (on ``ports`` when given, else on free ones).

    Returns once every server answers ``/health`` with 200 (``wait=False``: once their processes
    are started; :meth:`ServerGroup.wait_ready` then waits, ``inference.setup_timeout`` from the
    launch); raises :class:`LaunchError` (after closing what it started) otherwise. Logs go to
    ``log_dir/server-<i>.log``. Embedded CPU servers get ``OMP_NUM_THREADS`` from
    :func:`~areal_agents.runtime.cpus.server_threads` unless it is set.
    """
    backend = cfg.inference.backend
    if backend not in ("embedded", "sglang"):
        raise ConfigError("inference.backend", f"cannot launch servers for backend {backend!r}")
    if backend == "sglang":
        check_sglang()
    n = int(cfg.inference.num_servers if n is None else n)
    env = dict(env or {})
    if backend == "embedded" and str(cfg.inference.device) == "cpu" and "OMP_NUM_THREADS" not in {**os.environ, **env}:
        # CPU servers and the trainer share the cores; oversubscribed OpenMP pools busy-wait.
        env["OMP_NUM_THREADS"] = str(server_threads(n))
    logs = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="areal-servers-"))
    logs.mkdir(parents=True, exist_ok=True)
    group = ServerGroup(backend, time.monotonic() + float(cfg.inference.setup_timeout))
    try:
        for i in range(n):
            port = ports[i] if ports else 0 if backend == "embedded" else free_port(cfg.inference.host)
            cmd = (embedded_command(cfg, model_path, port, parent_pid=os.getpid()) if backend == "embedded"
                   else sglang_command(cfg, model_path, port, i))
            log_path = logs / f"server-{i}.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            handle = ServerHandle(f"{cfg.inference.host}:{port}", _start(cmd, log_path, env), log_path, offset)
            _LIVE.add(handle)
            group.append(handle)
    except BaseException:
        group.close()
        raise
    if wait:
        group.wait_ready()
    return group


@atexit.register
def _close_all() -> None:
    for handle in list(_LIVE):
        handle.close(timeout=3.0)


def _kill_all() -> None:
    """SIGKILL every live server's process group at once (the process is about to end outright)."""
    for handle in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.process.pid, signal.SIGKILL)


on_hard_exit(_kill_all)


@contextlib.contextmanager
def inference_servers(cfg: ExperimentConfig, model_path: str, log_dir: str | os.PathLike[str] | None = None) -> Iterator[list[str]]:
    """Yield ``host:port`` addresses of a run's healthy servers; launched ones are stopped on exit.

    ``inference.backend=remote`` attaches to ``inference.addresses`` (waiting for their
    ``/health``) and leaves them running; otherwise servers are launched, logging to ``log_dir``
    (default: the run dir's ``logs/``).
    """
    with starting_servers(cfg, model_path, log_dir) as ready:
        yield ready()


@contextlib.contextmanager
def starting_servers(cfg: ExperimentConfig, model_path: str,
                     log_dir: str | os.PathLike[str] | None = None) -> Iterator[Callable[[], list[str]]]:
    """:func:`inference_servers` yielding as soon as the servers' processes are started, so that
    the caller sets itself up while they load (a run builds its trainer); calling what it yields
    waits for them (:meth:`ServerGroup.wait_ready`; remote ones: their ``/health``) and returns
    their addresses."""
    if cfg.inference.backend == "remote":
        from areal_agents.inference.control import wait_healthy

        def attached() -> list[str]:
            wait_healthy(list(cfg.inference.addresses), timeout=cfg.inference.setup_timeout)
            return list(cfg.inference.addresses)

        yield attached
        return
    logs = Path(log_dir) if log_dir is not None else Path(cfg.run_dir) / "logs"
    with launch_servers(cfg, model_path, log_dir=logs, wait=False) as group:
        yield group.wait_ready


JUDGE_URL_ENV = "AREAL_AGENTS_JUDGE_URL"
"""Where a run's judge server is announced to the judges of its reward workers."""


@contextlib.contextmanager
def judge_server(cfg: ExperimentConfig, log_dir: str | os.PathLike[str] | None = None) -> Iterator[Callable[[], str | None]]:
    """The run's judge (``judge.model_path``): one server of that model on ``inference.backend``,
    frozen (no weight sync reaches it), on a port chosen at once so that its OpenAI base URL is
    exported as ``$AREAL_AGENTS_JUDGE_URL`` at once, to the processes started (or built) after it:
    the rollout's and the reward workers. Yields as soon as its process is started, so that the run
    sets itself up while it loads; calling what it yields waits for it (:meth:`ServerGroup.wait_ready`)
    and returns the URL. Without a judge it yields a call that returns None."""
    if not cfg.judge.model_path:
        yield lambda: None
        return
    logs = Path(log_dir) if log_dir is not None else Path(cfg.run_dir) / "logs" / "judge"
    with launch_servers(cfg, cfg.judge.model_path, 1, log_dir=logs, ports=[free_port(cfg.inference.host)],
                        wait=False) as group:
        url = f"http://{group.addresses[0].removeprefix('http://')}/v1"
        before = os.environ.get(JUDGE_URL_ENV)
        os.environ[JUDGE_URL_ENV] = url

        def ready() -> str:
            group.wait_ready()
            return url

        try:
            yield ready
        finally:
            if before is None:
                os.environ.pop(JUDGE_URL_ENV, None)
            else:
                os.environ[JUDGE_URL_ENV] = before
