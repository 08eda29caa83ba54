"""A launched process ends with its launcher even when a worker thread launched it (where
``PR_SET_PDEATHSIG`` would not fire): :func:`areal_agents.runtime.lifeline.watch_parent`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from areal_agents.config import ConfigError, ExperimentConfig
from areal_agents.inference.launcher import embedded_command
from trainers.dist import torchrun_command

REPO = Path(__file__).resolve().parents[2]

# The launcher: starts a child from a *worker thread*, prints its pid, then sleeps until killed.
LAUNCHER = """
import subprocess, sys, threading, time
child = ("from areal_agents.runtime.lifeline import watch_parent; import os, time; "
         "watch_parent(os.getppid(), interval=0.1); print('ready', flush=True); time.sleep(60)")
def launch():
    p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    print(p.pid, flush=True)
t = threading.Thread(target=launch); t.start(); t.join()
time.sleep(60)
"""


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_child_of_a_killed_launcher_exits() -> None:
    """Kill a launcher whose worker thread started a child: the child goes (polled with a generous
    30 s deadline; it watches its parent every 0.1 s)."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        child = int(launcher.stdout.readline())
        assert psutil.pid_exists(child)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 30
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _running(child):
            os.kill(child, signal.SIGKILL)
            pytest.fail("the child outlived its SIGKILLed launcher by 30 s")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()


def test_embedded_command_names_its_launcher() -> None:
    cmd = embedded_command(ExperimentConfig(), "/m", 0, parent_pid=1234)
    assert cmd[cmd.index("--parent-pid") + 1] == "1234"
    assert "--parent-pid" not in embedded_command(ExperimentConfig(), "/m", 0)


def test_several_trainer_nodes_need_a_rendezvous() -> None:
    from areal_agents.config.loader import load_config

    with pytest.raises(ConfigError, match=r"^trainer.rdzv_endpoint: trainer.nnodes=2 needs"):
        load_config(None, ["trainer.nnodes=2"])
    cfg = load_config(None, ["trainer.nnodes=2", "trainer.rdzv_endpoint=node0:29500", "launcher=ray"])
    assert cfg.launcher == "ray" and cfg.weights_dir.endswith(os.path.join("trial", "weights"))
    cmd = torchrun_command(cfg.trainer.nproc, "areal_agents.cli", ["run"], nnodes=cfg.trainer.nnodes,
                           rdzv_endpoint=cfg.trainer.rdzv_endpoint)
    assert "--nnodes=2" in cmd and "--rdzv-endpoint=node0:29500" in cmd and "--standalone" not in cmd
    with pytest.raises(ConfigError, match=r"^launcher: must be one of local, ray"):
        load_config(None, ["launcher=slurm"])
