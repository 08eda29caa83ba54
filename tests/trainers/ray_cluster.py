"""A real two-node Ray cluster on this machine, started with ``ray start`` for a test module.

The head carries the custom resource ``node_a``, the second node ``node_b``, so a test can see
where the launcher placed each actor. The cluster lives in its own temp dir with its own ports
(nothing under ``~/.ray``), and :meth:`RayCluster.stop` ends exactly the processes it started
(found by that temp dir), never another cluster on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from areal_agents.inference.launcher import free_port

__all__ = ["RayCluster", "cluster_processes"]

REPO = Path(__file__).resolve().parents[2]


def cluster_processes(temp_dir: str) -> list[psutil.Process]:
    """The live processes of the cluster in ``temp_dir``: its daemons (their command lines name
    the temp dir) and everything they started (workers, agents, what the workers launched)."""
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in proc.info["cmdline"] or ()):
                roots.append(proc)
        except psutil.Error:
            continue
    found = {p.pid: p for p in roots}
    for root in roots:
        try:
            found.update({c.pid: c for c in root.children(recursive=True)})
        except psutil.Error:
            pass
    alive = []
    for proc in found.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            pass
    return alive


class RayCluster:
    """``ray start --head`` (resource ``node_a``) plus one more node (``node_b``), ``cpus`` logical CPUs each."""

    def __init__(self, cpus: int = 3) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="rt-", dir="/tmp")  # short: Ray's socket paths have a length cap
        import ray

        self.port = free_port()
        self.ip = ray.util.get_node_ip_address()  # this host's address, as Ray's nodes advertise it
        self.address = f"{self.ip}:{self.port}"
        self.cpus = cpus
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": self.temp_dir,
                    "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0"}
        self.log = Path(self.temp_dir) / "start.log"

    def _ray(self, *args: str) -> None:
        with open(self.log, "a") as log:
            subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", *args], cwd=REPO, env=self.env,
                           stdout=log, stderr=subprocess.STDOUT, check=True, timeout=180)

    def start(self) -> RayCluster:
        free = [str(free_port()) for _ in range(4)]
        try:
            self._ray("--head", f"--port={self.port}", f"--num-cpus={self.cpus}", "--resources={\"node_a\": 1}",
                      f"--temp-dir={self.temp_dir}", "--include-dashboard=false", "--disable-usage-stats",
                      f"--ray-client-server-port={free[0]}",
                      f"--node-manager-port={free[1]}", f"--object-manager-port={free[2]}")
            self._ray(f"--address={self.address}", f"--num-cpus={self.cpus}", "--resources={\"node_b\": 1}",
                      f"--temp-dir={self.temp_dir}", "--disable-usage-stats")
        except BaseException:
            self.stop()
            raise
        return self

    def query(self, code: str, timeout: float = 90) -> str:
        """Run ``code`` in a fresh driver connected to the cluster (``ray`` is imported); its stdout."""
        script = f"import ray\nray.init(address={self.address!r}, logging_level='error')\n{code}\n"
        out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=self.env, capture_output=True, text=True,
                             timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    def processes(self) -> list[psutil.Process]:
        return cluster_processes(self.temp_dir)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every process of this cluster (and only those)."""
        procs = self.processes()
        for proc in procs:
            try:
                proc.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=8)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def wait_for(predicate: Any, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
