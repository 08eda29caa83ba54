"""End to end: ``areal-agents run`` with two embedded servers and weights broadcast over gloo;
one server is SIGKILLed mid-run. The run must finish every step on the other server, skip the
dead one in weight sync (saying so), and lose no episode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from reliability_support import REPO, make_model, record

STEPS = 8


def _servers(pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(pid).children(recursive=True)
            if "areal_agents.inference.server" in " ".join(c.cmdline())]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_run_survives_a_killed_inference_server(tmp_path: Path) -> None:
    model = make_model(tmp_path)
    run_dir = tmp_path / "runs" / "kill" / "trial"
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", f"actor.path={model}",
           f"output_dir={tmp_path / 'runs'}", "experiment_name=kill", f"trainer.total_steps={STEPS}",
           "inference.num_servers=2", "trainer.weight_sync=gloo", "rollout.batch_size=2", "rollout.group_size=4",
           "sampling.max_new_tokens=6", "eval.n=4", "eval.every=0", "trainer.save_every=0",
           "logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    metrics = run_dir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and '"version": 2' in metrics.read_text():
                break
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        servers = _servers(proc.pid)
        assert len(servers) == 2
        servers[1].send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        rc = proc.wait(400)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "run.log").read_text()
    assert rc == 0, out[-3000:]
    assert "is unreachable; weight sync skips it" in out
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["version"] for r in train] == list(range(1, STEPS + 1))
    assert train[-1]["inference/servers_down"] == 1
    killed_at = next(r["version"] for r in train if r["inference/servers_down"])
    last = train[-1]
    submitted = last["rollout/submitted"]
    accounted = last["rollout/accepted"] + last["rollout/failed"] + last["rollout/dropped"] + last["rollout/in_flight"]
    assert submitted == accounted, last
    # the dead server's requests were resent to the live one
    failed = {k: v for k, v in last.items() if k.startswith("rollout/failed")}
    assert last["rollout/failed"] == 0, (failed, [line for line in out.splitlines() if "rror" in line][-20:])
    record("run_with_server_sigkill", command="areal-agents run --env math inference.num_servers=2 "
           "trainer.weight_sync=gloo", steps=STEPS, first_version_without_it=killed_at,
           finished_s_after_kill=round(time.monotonic() - t_kill, 1), episodes_submitted=submitted, failed=0)
