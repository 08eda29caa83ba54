"""``areal-agents run launcher=ray`` on a real two-node Ray cluster started with ``ray start``.

One cluster for the module (head ``node_a``: the two inference servers; second node ``node_b``:
the two trainer ranks) and two short runs of the same command:

1. a trainer rank's actor is SIGKILLed after a checkpoint: the driver ends the run within
   seconds with a one-line error, and the checkpoint is intact;
2. the same command resumes it (``trainer.recover=auto``); one server actor is SIGKILLed
   mid-run: its server process goes with it, Ray restarts it on the same node and port, no
   episode is lost, every step trains (finite losses, versions advancing).

3. a third run (its own output dir), with disk weight sync through ``ray.shared_dir``, gets
   SIGTERM mid-run: the ranks save a checkpoint and the driver exits 130 ("interrupted").

After each run no actor, placement group or launched process is left on the cluster.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from ray_cluster import RayCluster, wait_for

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
LEFTOVERS = """
import json, ray._private.state as st
from ray.util.placement_group import placement_group_table
actors = [a["State"] for a in st.actors().values()]
restarts = [a["NumRestarts"] for a in st.actors().values() if a["ActorClassName"] == "ServerActor"]
pgs = [p["state"] for p in placement_group_table().values()]
print(json.dumps({"actors": actors, "pgs": pgs, "server_restarts": restarts}))
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with RayCluster(cpus=3) as c:
        yield c


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(REPO / "tests" / "reliability"))
    from reliability_support import make_model

    return make_model(tmp_path_factory.mktemp("ray-model"))


def _command(cluster: RayCluster, model: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", "launcher=ray",
            f"ray.address={cluster.address}", "ray.server_resource=node_a", "ray.trainer_resource=node_b",
            "inference.num_servers=2", "trainer.nproc=2", "trainer.weight_sync=gloo", f"actor.path={model}",
            f"output_dir={out}", "experiment_name=ray", f"trainer.total_steps={STEPS}", "trainer.save_every=1",
            "rollout.batch_size=2", "rollout.group_size=2", "sampling.max_new_tokens=6", "eval.n=2", "eval.every=0",
            "logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]  # fmt: skip


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0"})


def _wait_metric(proc: subprocess.Popen[bytes], metrics: Path, text: str, log: Path, timeout: float = 240,
                 skip: int = 0) -> None:
    """Until a line after the first ``skip`` of ``metrics`` holds ``text`` (the run still going)."""
    def seen() -> bool:
        return metrics.exists() and text in "".join(metrics.read_text().splitlines(keepends=True)[skip:])

    ok = wait_for(lambda: proc.poll() is not None or seen(), timeout, 0.1)
    assert ok and proc.poll() is None, f"no {text} in {metrics}:\n{log.read_text()[-3000:]}"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _assert_nothing_left(cluster: RayCluster) -> None:
    """No live actor or placement group, and no server or rank process on any node."""
    def clean() -> bool:
        state = json.loads(cluster.query(LEFTOVERS).strip().splitlines()[-1])
        live = [s for s in state["actors"] if s != "DEAD"] + [s for s in state["pgs"] if s != "REMOVED"]
        launched = [p for p in cluster.processes()
                    if any(m in " ".join(p.cmdline()) for m in ("areal_agents.inference.server", "areal_agents.cli"))]
        return not live and not launched
    assert wait_for(clean, 30, 1.0), "actors, placement groups or processes left on the cluster"


def _rows(metrics: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_on_two_ray_nodes(cluster: RayCluster, model: Path, tmp_path: Path) -> None:
    cmd = _command(cluster, model, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "ray" / "trial"
    metrics = run_dir / "metrics.jsonl"

    # 1. A trainer rank dies after a checkpoint: the run ends at once, the checkpoint is kept.
    log_a = tmp_path / "run-a.log"
    proc = _start(cmd, log_a)
    try:
        _wait_metric(proc, metrics, '"version": 2', log_a)
        placement = json.loads((run_dir / "ray_placement.json").read_text())
        assert [s["labels"] for s in placement["servers"]] == [["node_a"], ["node_a"]]
        assert [r["labels"] for r in placement["ranks"]] == [["node_b"], ["node_b"]]
        assert all(not s["address"].startswith("127.") for s in placement["servers"])  # reachable from other nodes
        os.kill(placement["ranks"][1]["pid"], signal.SIGKILL)
        rc = proc.wait(120)  # a deadline: the run ends on its own, not at the test's kill below
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log_a.read_text()
    assert rc == 1, out[-3000:]
    assert "error: trainer rank 1 (node " in out and "trainer.recover=auto" in out, out[-2000:]
    from trainers.checkpoint import find_latest

    latest = find_latest(run_dir / "checkpoints")
    assert latest is not None and json.loads((latest / "meta.json").read_text())["step"] >= 1  # the step being saved at the kill may be lost, never a complete one
    _assert_nothing_left(cluster)

    # 2. The same command resumes; a server actor is killed mid-run and comes back.
    log_b = tmp_path / "run-b.log"
    resumed_from = json.loads((latest / "meta.json").read_text())["step"]
    lines_before = len(metrics.read_text().splitlines())
    (run_dir / "ray_placement.json").unlink()
    proc = _start(cmd, log_b)
    try:
        _wait_metric(proc, metrics, f'"version": {resumed_from + 1}', log_b, skip=lines_before)
        placement = json.loads((run_dir / "ray_placement.json").read_text())
        victim = placement["servers"][1]
        os.kill(victim["pid"], signal.SIGKILL)
        assert wait_for(lambda: _gone(victim["server_pid"]), 20), "the dead actor's server process lives on"
        rc = proc.wait(400)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log_b.read_text()
    assert rc == 0, out[-3000:]
    assert f"recovered step {resumed_from}" in out
    state = json.loads(cluster.query(LEFTOVERS).strip().splitlines()[-1])
    assert sum(state["server_restarts"]) == 1, state  # Ray restarted the killed server actor (same bundle)
    train = [r for r in _rows(metrics)[lines_before:] if "train/loss" in r]
    assert [r["version"] for r in train] == list(range(resumed_from + 1, STEPS + 1))
    assert all(math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"]) for r in train)
    assert all(r["train/n_tokens"] > 0 for r in train)
    assert any(r["inference/servers_down"] == 1 for r in train)  # reported, skipped in weight sync
    last = train[-1]
    accounted = last["rollout/accepted"] + last["rollout/failed"] + last["rollout/dropped"] + last["rollout/in_flight"]
    assert last["rollout/submitted"] == accounted and last["rollout/failed"] == 0, last  # no episode lost
    _assert_nothing_left(cluster)

    # 3. SIGTERM to the driver: the ranks checkpoint and stop, everything is torn down.
    term_dir = tmp_path / "runs-term" / "ray" / "trial"
    log_c = tmp_path / "run-c.log"
    shared = tmp_path / "shared"
    cmd = [a.replace("trainer.weight_sync=gloo", "trainer.weight_sync=disk")
           for a in _command(cluster, model, tmp_path / "runs-term")] + [f"ray.shared_dir={shared}"]
    proc = _start(cmd, log_c)
    try:
        _wait_metric(proc, term_dir / "metrics.jsonl", '"version": 2', log_c)
        assert any((shared / "ray" / "trial" / "weights").glob("v*")), log_c.read_text()[-2000:]  # synced via disk
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(180)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log_c.read_text()
    assert rc == 130 and "interrupted" in out, out[-3000:]
    assert find_latest(term_dir / "checkpoints") is not None, out[-2000:]
    _assert_nothing_left(cluster)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_request_the_cluster_cannot_place_is_one_line(cluster: RayCluster, model: Path, tmp_path: Path) -> None:
    """Servers asked on a node label no node has, or more CPUs than the cluster has: the run
    fails at once with one line naming the resource, and leaves nothing on the cluster."""
    base = _command(cluster, model, tmp_path / "runs")
    for change, needle in (("ray.server_resource=node_z", "need node_z="), ("trainer.nproc=9", "need CPU=9")):
        key = change.split("=")[0]
        cmd = [a for a in base if not a.startswith(key + "=")] + [change]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode != 0 and len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
        _assert_nothing_left(cluster)
