"""Thread pools and worker counts follow the cores a process may use (its affinity mask, as
``taskset -c 0`` sets it), not the machine's count."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from areal_agents.runtime.cpus import usable_cpus

_ON_ONE_CORE = """
import os
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # what `taskset -c N` does
from areal_agents.rewards.runner import default_reward_workers
from areal_agents.runtime.cpus import usable_cpus
from trainers.loop import cpu_trainer_threads
print(usable_cpus(), default_reward_workers(), cpu_trainer_threads(0), cpu_trainer_threads(1))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="affinity masks are a Linux feature")
def test_a_process_on_one_core_sizes_everything_for_one_core() -> None:
    out = subprocess.run([sys.executable, "-c", _ON_ONE_CORE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "1", "1"], out.stderr[-2000:]


def test_usable_cpus_is_the_affinity_mask_here() -> None:
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert usable_cpus() == expected >= 1
