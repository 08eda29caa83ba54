"""Shared pieces of the reliability suite: figures file, tiny model, real server subprocesses.

Every test of the suite records what it measured with :func:`record` (one entry per fault), so
that the documented reliability table comes from real runs. The figures go to a file in the
temporary directory unless ``AREAL_RELIABILITY_RESULTS`` names another one: running the tests
modifies no tracked file; ``AREAL_RELIABILITY_RESULTS=benchmarks/results/reliability.json``
refreshes the committed figures.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from areal_agents.config import ExperimentConfig
from areal_agents.inference.control import wait_healthy
from areal_agents.inference.launcher import ServerGroup, embedded_command, launch_servers

__all__ = ["REPO", "RESULTS", "alive", "corpus", "find_marker_processes", "make_model", "record", "restart_server",
           "rss_mb", "start_servers"]

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(os.environ.get("AREAL_RELIABILITY_RESULTS")
               or Path(tempfile.gettempdir()) / f"areal-agents-reliability-{os.getuid()}.json").resolve()


def alive(pids: list[int]) -> list[int]:
    """The processes of ``pids`` that still run (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def record(fault: str, **figures: Any) -> None:
    """Merge ``figures`` of ``fault`` into the results file (safe across processes)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS.with_suffix(".lock.tmp"), "w") as lock:  # *.tmp is git-ignored (benchmarks/results)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        except ValueError:
            data = {}
        data[fault] = {**figures, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = RESULTS.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, RESULTS)
    print(f"[reliability] {fault}: {json.dumps(figures, sort_keys=True)}")


def corpus(n: int = 200, seed: int = 0) -> Iterator[str]:
    """Chat-formatted arithmetic text for the tiny tokenizer."""
    rng = random.Random(seed)
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>\n"


def make_model(root: Path, seed: int = 0) -> Path:
    """A tiny Qwen2 model dir with a tokenizer trained on :func:`corpus`."""
    from trainers.tiny_model import build_tiny_model

    return build_tiny_model(corpus(), root / f"model-{seed}", seed=seed)


def start_servers(model: Path, n: int, log_dir: Path, **inference: Any) -> ServerGroup:
    """``n`` embedded server subprocesses on loopback (one OpenMP thread each)."""
    cfg = ExperimentConfig()
    cfg.inference.setup_timeout = 180.0
    for key, value in inference.items():
        setattr(cfg.inference, key, value)
    return launch_servers(cfg, model, n, log_dir=log_dir, env={"OMP_NUM_THREADS": "1"})


def restart_server(model: Path, address: str, log_path: Path, **inference: Any) -> subprocess.Popen[bytes]:
    """Start an embedded server again on the port of ``address``; wait until it is healthy."""
    cfg = ExperimentConfig()
    for key, value in inference.items():
        setattr(cfg.inference, key, value)
    port = int(address.rsplit(":", 1)[1])
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(embedded_command(cfg, model, port), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_healthy(address, timeout=180)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc


def rss_mb(pid: int | None = None) -> float:
    """Resident set size of a process in MiB."""
    return psutil.Process(pid).memory_info().rss / 2**20


def find_marker_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or ()):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def settled_thread_count(timeout: float = 3.0) -> int:
    """``threading.active_count()`` once the env-call pool's idle threads (left by earlier work in
    this process; they leave after 1 s idle) are gone: a baseline that later counts can equal."""
    import threading

    deadline = time.monotonic() + timeout
    while any(t.name == "env-call" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return threading.active_count()
