"""Model-written code in the sandbox against real targets: the project's own run/checkpoint
files, /etc/passwd, a real listening loopback server, unbounded memory and CPU, and daemonized
grandchildren (double fork + setsid). Adds to tests/tools/test_tools_sandbox.py only what it lacks."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_support import REPO, find_marker_processes, record

from areal_agents.tools.sandbox import run_python

FIGURES: dict[str, object] = {}


@pytest.fixture
def secret_run_dir() -> Iterator[Path]:
    """A real checkpoint-like file under the project's runs/ directory."""
    root = REPO / "runs" / f"reliability-secret-{os.getpid()}"
    ckpt = root / "checkpoints" / "step_00000001"
    ckpt.mkdir(parents=True)
    (ckpt / "state.pt").write_bytes(b"SECRET-CHECKPOINT-BYTES")
    (root / "config.yaml").write_text("secret: 1\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_project_files_and_passwd_cannot_be_read_or_written(secret_run_dir: Path) -> None:
    state = secret_run_dir / "checkpoints" / "step_00000001" / "state.pt"
    code = f"""
import os
targets = [{str(state)!r}, {str(secret_run_dir / 'config.yaml')!r}, '/etc/passwd', '/etc/shadow',
           '/proc/1/root{state}', '/proc/self/root{state}', {str(REPO / 'pyproject.toml')!r}]
os.symlink({str(state)!r}, 'link')
targets.append('link')
targets.append('../' * 12 + {str(state)[1:]!r})
for t in targets:
    try:
        data = open(t, 'rb').read()
        print('READ', t, data[:40])
    except OSError as exc:
        print('DENIED', t, type(exc).__name__)
try:
    os.makedirs({str(secret_run_dir)!r}, exist_ok=True)
    open({str(secret_run_dir / 'pwned.txt')!r}, 'w').write('x')
    print('WROTE')
except OSError as exc:
    print('WRITE-DENIED', type(exc).__name__)
"""
    r = run_python(code, timeout_s=10)
    assert r.isolation["namespaces"], r.isolation_error
    lines = r.stdout.splitlines()
    assert r.exit_code == 0, r.stderr
    assert not [ln for ln in lines if ln.startswith("READ")], lines
    denied = sum(ln.startswith("DENIED") for ln in lines)
    assert denied == 9, lines
    assert not (secret_run_dir / "pwned.txt").exists()  # any write landed in a private tmpfs
    assert state.read_bytes() == b"SECRET-CHECKPOINT-BYTES"
    FIGURES["file_reads_denied"] = denied


class Listener:
    """A real TCP server on 127.0.0.1 (and an abstract unix socket) that counts connections."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix_name = f"\0areal-reliability-{os.getpid()}"
        self.unix.bind(self.unix_name)
        self.unix.listen()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp_port = self.udp.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, args=(s,), daemon=True) for s in (self.tcp, self.unix)]
        for t in self._threads:
            t.start()

    def _accept(self, sock: socket.socket) -> None:
        sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def connections_before_probe(self, timeout: float = 10.0) -> int:
        """Connect once more and wait until that probe is accepted: connections are accepted in
        arrival order, so every earlier one has been counted by then. Returns the earlier ones."""
        before = self.accepted
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix_probe:
            unix_probe.connect(self.unix_name)
            with socket.create_connection(("127.0.0.1", self.port), timeout=5):
                deadline = time.monotonic() + timeout
                while self.accepted < before + 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
        assert self.accepted >= before + 2, "the probe connections were never accepted"
        return self.accepted - 2

    def datagrams_before_probe(self) -> int:
        """Send a marker datagram to ourselves and count the datagrams queued before it."""
        marker = b"areal-probe"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
            out.sendto(marker, ("127.0.0.1", self.udp_port))
        self.udp.settimeout(10)
        n = 0
        while self.udp.recv(100) != marker:
            n += 1
        return n

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for s in (self.tcp, self.unix, self.udp):
            s.close()


def test_no_connection_reaches_a_real_loopback_server() -> None:
    lst = Listener()
    try:
        probe = socket.create_connection(("127.0.0.1", lst.port), timeout=5)  # the server really listens
        probe.close()
        deadline = time.monotonic() + 5
        while lst.accepted < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lst.accepted == 1
        code = f"""
import socket
def attempt(name, fn):
    try:
        fn()
        print('CONNECTED', name)
    except OSError as exc:
        print('FAILED', name, type(exc).__name__, exc.errno)
def tcp(host):
    s = socket.socket(); s.settimeout(3); s.connect((host, {lst.port}))
def unix():
    s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect({lst.unix_name!r})
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('127.0.0.1', {lst.udp_port}))
def tcp6():
    s = socket.socket(socket.AF_INET6); s.settimeout(3); s.connect(('::1', {lst.port}))
def dns():
    socket.getaddrinfo('example.com', 80)
attempt('tcp-127.0.0.1', lambda: tcp('127.0.0.1'))
attempt('tcp-localhost', lambda: tcp('localhost'))
attempt('tcp6', tcp6)
attempt('abstract-unix', unix)
attempt('udp', udp)
attempt('dns', dns)
"""
        r = run_python(code, timeout_s=15)
        assert r.isolation["namespaces"], r.isolation_error
        lines = r.stdout.splitlines()
        blocked = sum(ln.startswith("FAILED") for ln in lines)
        assert len(lines) == 6 and blocked == 6, (lines, r.stderr)
        assert lst.connections_before_probe() == 1 and lst.datagrams_before_probe() == 0  # nothing from the sandbox
    finally:
        lst.close()
    FIGURES["network_attempts_blocked"] = blocked


def test_unbounded_growth_and_cpu_burn_are_stopped() -> None:
    grow = "hoard = []\nwhile True:\n    hoard.append(bytearray(16 * 2**20))\n"
    r = run_python(grow, memory_mb=256, timeout_s=20)
    assert r.exit_code == 1 and "MemoryError" in r.stderr and not r.timed_out
    burn = ("import signal, threading\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, "
            "signal.SIG_IGN)\ndef spin():\n    while True:\n        pass\nfor _ in range(4):\n"
            "    threading.Thread(target=spin).start()\nspin()\n")
    t0 = time.monotonic()
    r = run_python(burn, timeout_s=2)
    took = time.monotonic() - t0  # a figure only: how soon is a latency, not asserted in the default set
    assert r.exit_code == 137 and r.timed_out, (r.exit_code, r.timed_out, r.stderr)  # killed by its time limit
    FIGURES["cpu_burn_killed_after_s"] = round(took, 2)


@pytest.mark.parametrize("ending", ["exits", "times_out"])
def test_daemonized_grandchildren_do_not_survive(ending: str) -> None:
    marker = f"areal-reliability-daemon-{os.getpid()}-{time.monotonic_ns()}"
    code = f"""
import os, signal, sys, time
up_r, up_w = os.pipe()
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if os.fork() == 0:          # the double-forked daemon: reparented, own session, marker in its command line
        os.chdir('/')
        for fd in (0, 1, 2):
            os.close(fd)
        os.set_inheritable(up_w, True)
        os.execv(sys.executable, [sys.executable, '-c', 'import os, sys, time; os.write(int(sys.argv[1]), b"up"); '
                                  'time.sleep(120)', str(up_w), {marker!r}])
    os._exit(0)
os.close(up_w)
assert os.read(up_r, 2) == b'up'  # the daemon runs
print('spawned', flush=True)
{'time.sleep(60)' if ending == 'times_out' else ''}
"""
    r = run_python(code, timeout_s=2 if ending == "times_out" else 10)
    assert r.isolation["namespaces"], r.isolation_error
    assert "spawned" in r.stdout and r.timed_out == (ending == "times_out")
    deadline = time.monotonic() + 10  # the sandbox's pid namespace is torn down as it ends; allow for a slow reap
    while (survivors := find_marker_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    FIGURES[f"daemon_survivors_{ending}"] = len(survivors)
    assert survivors == []


def test_record_sandbox_figures() -> None:
    if FIGURES:
        record("sandbox_escapes", **FIGURES)
    assert all(v == 0 for k, v in FIGURES.items() if k.startswith("daemon_survivors")), FIGURES
