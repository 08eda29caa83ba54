"""End to end: ``areal-agents run --env math mode=online`` trained by apps in other processes
that know nothing of it (examples/online_client: the official ``openai`` client, and plain
``curl``), stopped with SIGTERM mid-run and recovered from its checkpoint: the ledger balances in
every metrics row, the rewarded sessions not trained yet survive the restart, the sessions left
open are counted as ``restart``, and the run finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainers.checkpoint import find_latest

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "examples" / "online_client"
ADMIN = "sk-admin-e2e-0123456789abcdefghij"
STEPS = 6
SETTINGS = [
    "mode=online", "online.port=0", "sft.warm_start_steps=4", "sft.batch_size=8", "sft.eval_every=0",
    f"trainer.total_steps={STEPS}", "trainer.save_every=1", "rollout.batch_size=2", "rollout.group_size=4",
    "eval.n=4", "eval.every=0", "logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
]  # fmt: skip


def wait_for(path: Path, proc: subprocess.Popen[bytes], log: Path, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {path.name} after {seconds} s"
        time.sleep(0.1)


def spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "w") as out:  # the child writes to its own copy of the descriptor
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def client(url: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return spawn([sys.executable, str(CLIENT / "client.py"), "--url", url, "--group-size", "4", "--concurrency", "2",
                  "--report-every", "5", "--minutes", "5"], log, env)


def stop(*procs: subprocess.Popen[bytes] | None) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
        if p is not None:
            p.wait(30)


def balanced_rows(metrics: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    online = [r for r in rows if "online/opened" in r]
    for r in online:
        assert r["online/opened"] == r["online/trained"] + r["online/dropped"] + r["online/in_flight"], r
        assert r["online/dropped"] == sum(v for k, v in r.items() if k.startswith("online/dropped/")), r
    return online


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_external_apps_train_an_online_run_that_survives_a_restart(tmp_path: Path,
                                                                   warm_cache: Callable[[str], Path]) -> None:
    cache = warm_cache("math-tiny")
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(cache), "OMP_NUM_THREADS": "1", "AREAL_AGENTS_ADMIN_KEY": ADMIN}
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", *SETTINGS, f"output_dir={tmp_path / 'runs'}"]
    run_dir = tmp_path / "runs" / "math" / "trial"
    first_log = tmp_path / "first.log"
    run = spawn(cmd, first_log, env)
    app = None
    try:
        wait_for(run_dir / "gateway.json", run, first_log)
        url = json.loads((run_dir / "gateway.json").read_text())["url"]
        app = client(url, env, tmp_path / "app1.log")
        shell = subprocess.run(["sh", str(CLIENT / "client.sh"), url, "4"], env=env, capture_output=True, text=True,
                               timeout=300)
        assert shell.returncode == 0, shell.stdout + shell.stderr
        assert shell.stdout.strip().endswith("of 4 right") and shell.stdout.count("(reward ") == 4
        deadline = time.monotonic() + 300
        while (latest := find_latest(run_dir / "checkpoints")) is None or latest.name < "step_00000002":
            assert run.poll() is None and time.monotonic() < deadline, first_log.read_text()[-3000:]
            time.sleep(0.1)
        run.send_signal(signal.SIGTERM)  # a checkpoint is written on the way out, then it ends by the signal
        assert run.wait(120) == 128 + signal.SIGTERM, first_log.read_text()[-3000:]
        assert app.wait(120) == 0, (tmp_path / "app1.log").read_text()[-2000:]
    finally:
        stop(run, app)
    assert "the gateway went away" in (tmp_path / "app1.log").read_text()
    assert not (run_dir / "gateway.json").exists()  # removed when the gateway stopped
    saved = find_latest(run_dir / "checkpoints")
    k = json.loads((saved / "meta.json").read_text())["step"]
    assert 2 <= k < STEPS
    state = torch.load(saved / "state.pt", weights_only=False)["rollout"]
    assert state["kind"] == "online" and state["trained"] >= 8 * k  # whole groups: at least 8 a step
    held = state["trained"] + sum(state["dropped"].values()) + len(state["waiting"])
    assert state["opened"] >= held and state["opened"] >= 8 * k + 4  # the shell app's 4 and the Python app's
    first_rows = balanced_rows(run_dir / "metrics.jsonl")
    assert first_rows and first_rows[-1]["online/trained"] >= 8 * k

    second_log = tmp_path / "second.log"
    run = spawn(cmd, second_log, env)
    app = None
    try:
        wait_for(run_dir / "gateway.json", run, second_log)  # written again by the new gateway
        url2 = json.loads((run_dir / "gateway.json").read_text())["url"]
        app = client(url2, env, tmp_path / "app2.log")
        assert run.wait(600) == 0, second_log.read_text()[-3000:]
        assert app.wait(120) == 0, (tmp_path / "app2.log").read_text()[-2000:]
    finally:
        stop(run, app)
    out = second_log.read_text()
    assert f"recovered step {k}" in out and "sessions" in out and "opened =" in out
    rows = balanced_rows(run_dir / "metrics.jsonl")
    last = rows[-1]
    assert last["online/trained"] >= 8 * STEPS and last["online/opened"] >= state["opened"]
    lost_at_restart = state["opened"] - held
    assert last.get("online/dropped/restart", 0) == lost_at_restart
    assert (run_dir / "final").is_dir()
