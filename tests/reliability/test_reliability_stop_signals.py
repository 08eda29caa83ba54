"""End to end: SIGTERM and Ctrl-C (SIGINT) end a real ``areal-agents run`` within seconds in
every phase (the warm start, an eval, the wait for a rollout batch), also when an agent hangs
and ignores its cancellation, and leave no process behind (servers, rollout process, workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from reliability_support import REPO, alive

from areal_agents.runtime.stopping import HARD_EXIT_AFTER
from trainers.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

AGENT_FILE = '''
import asyncio
import os
from pathlib import Path

from areal_agents import register_agent


_episodes = [0]


@register_agent("stuck")
async def stuck(client, row):
    """Asks once; from its second episode in a process on (the first: the run's preflight, or the
    rollout process's first), hangs, swallowing every cancellation (the worst an agent can do)."""
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}],
                                         max_tokens=2)
    _episodes[0] += 1
    if _episodes[0] == 1:
        return 0.0
    Path(os.environ["STUCK_MARKER"]).write_text("stuck")
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass
'''

BASE = ["rollout.batch_size=2", "rollout.group_size=2", "sampling.max_new_tokens=4", "trainer.total_steps=3",
        "logging.progress=false", "logging.plots=false", "logging.tensorboard=false", "eval.every=0"]


def _descendants(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize(("phase", "sig"), [("warm-start", signal.SIGTERM), ("eval", signal.SIGTERM),
                                            ("rollout", signal.SIGTERM), ("eval", signal.SIGINT)])
def test_a_signal_ends_the_run_in_any_phase(tmp_path: Path, phase: str, sig: signal.Signals) -> None:
    marker = tmp_path / "stuck"
    cache = tmp_path / "cache"
    args = [*BASE, f"output_dir={tmp_path / 'runs'}"]
    if phase == "warm-start":  # no actor.path: the run first trains the tiny model's warm start
        args += ["--env", "math", "sft.warm_start_steps=100000", "sft.eval_every=0"]
    else:
        model = build_tiny_model([f"{a}+{b}= {a + b}" for a in range(10, 40) for b in range(10, 40)], tmp_path / "m")
        (tmp_path / "agents.py").write_text(AGENT_FILE)
        args += ["--env", "math", "agent=stuck", f"imports=[{tmp_path / 'agents.py'}]", f"actor.path={model}",
                 "eval.n=4" if phase == "eval" else "eval.n=0"]
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(cache), "OMP_NUM_THREADS": "1", "STUCK_MARKER": str(marker)}
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "areal_agents.cli", "run", *args], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 400
        while proc.poll() is None and time.monotonic() < deadline:  # wait for the phase
            # the agent is stuck in its episode / the base model is written and the SFT on it is under way
            if marker.exists() if phase != "warm-start" else any(cache.glob("**/model.safetensors")):
                break
            time.sleep(0.1)
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()[-3000:]
        children = _descendants(proc.pid)
        proc.send_signal(sig)
        try:
            code = proc.wait(HARD_EXIT_AFTER + 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"the run did not end {HARD_EXIT_AFTER + 20:.0f} s after {sig.name} in {phase}")
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    deadline = time.monotonic() + 15
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = alive(children)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes outlived the run: {[psutil.Process(p).cmdline() for p in left if alive([p])]}"
    assert code != 0, code  # ended by the signal (the wait above is the deadline), not by the test's kill
    if phase != "warm-start":
        assert children, "the run had no child processes (servers) when it was signalled"
    print(f"{phase} {sig.name}: exit {code}, {len(children)} child processes ended")
