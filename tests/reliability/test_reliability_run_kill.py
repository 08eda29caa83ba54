"""End to end: ``areal-agents run`` (embedded servers, SFT warm start, async GRPO) SIGKILLed
mid-run; its server subprocesses must not outlive it, and the same command with
``trainer.recover=auto`` must resume from the last complete checkpoint and finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from reliability_support import REPO, alive, record

from trainers.checkpoint import find_latest

STEPS = 6
SETTINGS = [
    "sft.warm_start_steps=4", "sft.batch_size=8", "sft.eval_every=0", f"trainer.total_steps={STEPS}", "trainer.save_every=1",
    "trainer.recover=auto", "rollout.batch_size=2", "rollout.group_size=2", "eval.n=4", "eval.every=0",
    "logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_run_leaves_no_servers_and_recovers(tmp_path: Path, warm_cache: Callable[[str], Path]) -> None:
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", *SETTINGS, f"output_dir={tmp_path / 'runs'}"]
    cache = warm_cache("math-tiny")  # the warm start is built once per session: the kill and the resume are the subject
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "runs" / "math" / "trial"
    ckpts = run_dir / "checkpoints"
    log1 = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log1, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            latest = find_latest(ckpts) if ckpts.exists() else None
            if latest is not None and latest.name >= "step_00000002":
                break
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGKILL)  # no handler runs; the servers see their parent vanish
        t_kill = time.monotonic()
    finally:
        proc.wait(60)
        log1.close()
    assert children, "the run had no server subprocesses"
    deadline = time.monotonic() + 30
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphans = alive(children)
    orphans_gone_s = time.monotonic() - t_kill
    for pid in orphans:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert orphans == [], "server processes outlived the killed run"
    resumed_from = find_latest(ckpts)
    assert resumed_from is not None
    k = json.loads((resumed_from / "meta.json").read_text())["step"]
    assert 2 <= k < STEPS

    t0 = time.monotonic()
    second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"recovered step {k}" in second.stdout + second.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows if "train/loss" in r]
    assert steps[-(STEPS - k):] == list(range(k + 1, STEPS + 1))  # every step after the checkpoint, once
    assert find_latest(ckpts).name == f"step_{STEPS:08d}"
    record("run_sigkill_end_to_end", command="areal-agents run --env math (tiny settings)", steps=STEPS,
           killed_after_checkpoint=k, server_processes=len(children), orphaned_servers=0,
           servers_gone_after_s=round(orphans_gone_s, 2), resumed_run_s=round(time.monotonic() - t0, 1),
           steps_after_resume=steps[-(STEPS - k):])
