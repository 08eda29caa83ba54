"""Thread pools and worker counts follow the cores a process may use (its affinity mask, as
``taskset -c 0`` sets it), not the machine's count."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from areal_agents.runtime.cpus import OPENMP_SPIN_COUNT, usable_cpus, yield_idle_threads

_ON_ONE_CORE = """
import os
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # what `taskset -c N` does
from areal_agents.rewards.runner import default_reward_workers
from areal_agents.runtime.cpus import OPENMP_SPIN_COUNT, server_threads, trainer_threads, usable_cpus, yield_idle_threads
print(usable_cpus(), default_reward_workers(), trainer_threads(0), trainer_threads(1), server_threads(1))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="affinity masks are a Linux feature")
def test_a_process_on_one_core_sizes_everything_for_one_core() -> None:
    out = subprocess.run([sys.executable, "-c", _ON_ONE_CORE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "1", "1", "1"], out.stderr[-2000:]


def test_usable_cpus_is_the_affinity_mask_here() -> None:
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert usable_cpus() == expected >= 1


def test_a_command_lets_idle_openmp_threads_sleep_before_torch_loads() -> None:
    """The command line sets ``GOMP_SPINCOUNT`` first thing (torch's OpenMP reads it once, when it
    loads), so the command and the servers and ranks it starts inherit it; a user's choice stays."""
    code = ("import os, sys\nos.environ.pop('GOMP_SPINCOUNT', None)\nos.environ.pop('OMP_WAIT_POLICY', None)\n"
            "from areal_agents.cli.main import main\nimport areal_agents.runtime.cpus as cpus\n"
            "seen = []\norig = cpus.yield_idle_threads\n"
            "def spy(environ=None):\n    seen.append('torch' in sys.modules)\n    orig(environ)\n"
            "sys.modules['areal_agents.cli.main'].yield_idle_threads = spy\n"
            "main(['list'])\nprint(os.environ.get('GOMP_SPINCOUNT'), seen)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == f"{OPENMP_SPIN_COUNT} [False]", out.stderr[-2000:]


def test_a_users_own_wait_policy_is_kept() -> None:
    for given in ({"GOMP_SPINCOUNT": "7"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        env = dict(given)
        yield_idle_threads(env)
        assert env == given
    env = {}
    yield_idle_threads(env)
    assert env == {"GOMP_SPINCOUNT": str(OPENMP_SPIN_COUNT)}
