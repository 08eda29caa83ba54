"""Multi-node torchrun without Ray, on one machine: two ``areal-agents run`` processes with
``trainer.nnodes=2`` and one rendezvous endpoint (what Slurm starts on each node) form one
2-rank trainer against an embedded server given as ``inference.backend=remote``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_agents.inference.launcher import free_port
from trainers.checkpoint import find_latest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "reliability"))
from reliability_support import make_model, start_servers  # noqa: E402

STEPS = 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_torchrun_nodes_train_one_run(tmp_path: Path) -> None:
    model = make_model(tmp_path)
    with start_servers(model, 1, tmp_path / "server-logs") as servers:
        args = ["-m", "areal_agents.cli", "run", "--env", "math", f"actor.path={model}", "inference.backend=remote",
                f"inference.addresses=[{servers.addresses[0]}]", "trainer.nnodes=2", "trainer.nproc=1",
                f"trainer.rdzv_endpoint=127.0.0.1:{free_port()}", f"trainer.total_steps={STEPS}",
                f"output_dir={tmp_path / 'runs'}", "experiment_name=mn", "trainer.save_every=1",
                "rollout.batch_size=2", "rollout.group_size=2", "sampling.max_new_tokens=6", "eval.n=2",
                "eval.every=0", "logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        logs = [tmp_path / f"node{i}.log" for i in range(2)]
        nodes = []
        for log in logs:
            with open(log, "w") as out:
                nodes.append(subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=out,
                                              stderr=subprocess.STDOUT))
        try:
            codes = [p.wait(480) for p in nodes]
        finally:
            for p in nodes:
                if p.poll() is None:
                    p.kill()
    assert codes == [0, 0], "\n".join(log.read_text()[-2000:] for log in logs)
    run_dir = tmp_path / "runs" / "mn" / "trial"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["version"] for r in train] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["train/loss"]) and r["train/n_tokens"] > 0 for r in train)
    latest = find_latest(run_dir / "checkpoints")
    assert latest is not None
    assert json.loads((latest / "meta.json").read_text())["step"] == STEPS
    assert sorted(p.name for p in latest.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]  # 2 ranks
