"""The two Ray actors of ``launcher=ray`` (plain classes; :mod:`trainers.ray_launcher` wraps
them with ``ray.remote`` so that nothing here imports Ray at module level).

* :class:`ServerActor` — one inference server (embedded or SGLang) on the node of its
  placement-group bundle, bound to that node's IP. It starts the server in ``__init__``, so
  a restart by Ray (``ray.server_restarts``) brings it back on the same node and port, where
  the client and the weight sync find it again.
* :class:`RankActor` — one trainer rank: it runs ``python -m areal_agents.cli run`` in a child
  process with the torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` of rank 0's
  node, ...), the same path a ``torchrun`` rank takes. The child watches the actor's pid, so a
  killed actor takes its rank down within a second.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from areal_agents.config import ExperimentConfig
from areal_agents.inference.launcher import ServerGroup, free_port, launch_servers
from areal_agents.runtime.lifeline import PARENT_PID_ENV

__all__ = ["RankActor", "ServerActor", "missing_paths", "node_info"]


def node_info() -> dict[str, Any]:
    """Where the calling actor runs: its node's IP and Ray node id, and its pid."""
    import ray

    return {"ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid()}


def missing_paths(paths: list[str]) -> list[str]:
    """Those of ``paths`` that do not exist on this node."""
    return [p for p in paths if not os.path.exists(p)]


def _wait_port_free(host: str, port: int, timeout: float = 20.0) -> None:
    """A restarted server takes its old port: wait until the dead one's socket is released."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.2)


def _kill_group(pid_file: Path) -> None:
    """SIGKILL the process group of the server whose pid ``pid_file`` holds (a previous launch)."""
    with contextlib.suppress(OSError, ValueError):
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)


class ServerActor:
    """Inference server ``index`` of a run, launched on this actor's node."""

    def __init__(self, cfg: ExperimentConfig, model_path: str, index: int, log_dir: str) -> None:
        self.info = node_info()
        cfg = copy.deepcopy(cfg)
        cfg.inference.host = self.info["ip"]  # reachable from the other nodes
        logs = Path(log_dir) / f"server-{index}"
        logs.mkdir(parents=True, exist_ok=True)
        port_file, pid_file = logs / "port", logs / "pid"  # on this node: a restart (same bundle) reads them
        if port_file.exists():
            port = int(port_file.read_text())
            _kill_group(pid_file)  # the dead actor's server, if it still shuts down
            _wait_port_free(self.info["ip"], port)
        else:
            port = free_port(self.info["ip"])
            port_file.write_text(str(port))
        threads = str(max(1, int(cfg.ray.cpus_per_server)))
        self.group: ServerGroup = launch_servers(cfg, model_path, 1, log_dir=logs, ports=[port],
                                                 env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)})
        self.info["address"] = self.group.addresses[0]
        self.info["server_pid"] = self.group[0].process.pid
        pid_file.write_text(str(self.info["server_pid"]))

    def describe(self) -> dict[str, Any]:
        """``{ip, node_id, pid, address, server_pid}``."""
        return dict(self.info)

    missing_paths = staticmethod(missing_paths)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait for it."""
        self.group.close()


class RankActor:
    """One trainer rank; ``run`` blocks until the rank's process ends (the actor takes a second
    call meanwhile, ``terminate``, so it must be created with ``max_concurrency=2``)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    describe = staticmethod(node_info)

    def free_port(self) -> int:
        """A free port on this node (rank 0's: the process group's rendezvous)."""
        return free_port(node_info()["ip"])

    missing_paths = staticmethod(missing_paths)

    def run(self, config_yaml: str, env: dict[str, str], cwd: str) -> int:
        """``areal-agents run --config <config_yaml>`` as one rank; returns its exit code."""
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="areal-rank-", delete=False) as fh:
            fh.write(config_yaml)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "areal_agents.cli", "run", "--config", fh.name],
                env={**os.environ, **env, PARENT_PID_ENV: str(os.getpid())}, stdin=subprocess.DEVNULL,
                cwd=cwd if os.path.isdir(cwd) else None, start_new_session=True)
            return self.proc.wait()
        finally:
            os.unlink(fh.name)

    def terminate(self) -> bool:
        """SIGTERM the rank (it saves a checkpoint at the step boundary and leaves); False if none runs."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        self.proc.send_signal(signal.SIGTERM)
        return True
