"""Trainer death: a real training process (TrainEngine + Checkpointer + RolloutExecutor) is
SIGKILLed mid-step and at three points inside a checkpoint save; each restart must resume
from the last *complete* checkpoint and the dataloader must neither repeat nor skip rows.
A checkpoint save onto a really full filesystem (a 3 MiB tmpfs) must fail cleanly, leaving
the previous checkpoint loadable.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_support import RESULTS, record
from reliability_trainer_worker import make_executor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainers"))
from trainer_helpers import make_cfg, nll_loss_fn, step_batch, tiny_qwen  # noqa: E402

from trainers.checkpoint import Checkpointer, find_latest  # noqa: E402

WORKER = Path(__file__).with_name("reliability_trainer_worker.py")
STEPS = 11


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen(tmp_path_factory.mktemp("tiny") / "model")


def reference_rows(steps: int) -> dict[int, list[int]]:
    """Rows per step of an uninterrupted run (the executor alone: training does not affect them)."""
    out = {}
    with make_executor() as ex:
        for s in range(steps):
            out[s] = [g[0].info["row"] for g in ex.prepare_batch(timeout=30)]
            ex.set_version(s + 1)
    return out


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text():
            return
        assert proc.poll() is None, f"worker exited with {proc.returncode} before {text!r}:\n{log.read_text()}"
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {log}")


@pytest.mark.slow  # a killed run, twice, and its resumes (~35 s)
@pytest.mark.timeout(600)
def test_sigkill_mid_step_and_mid_checkpoint_resumes_from_last_complete(model_dir: Path, tmp_path: Path) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "events.log"
    base = [sys.executable, str(WORKER), str(model_dir), str(ckpt), str(log), str(STEPS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # (phase, step it parks in, newest complete checkpoint after the kill)
    plan = [("train", 3, 3), ("dcp", 5, 5), ("fsync", 7, 7), ("prune", 8, 9)]
    kill_times: list[float] = []
    recovery_s: list[float] = []  # kill -> the restarted process has loaded the checkpoint
    previous = None
    for phase, step, newest in plan:
        proc = subprocess.Popen([*base, phase, str(step)], env=env)
        try:
            if previous is not None:
                wait_for(log, f"resume {previous}", proc)
                recovery_s.append(round(time.monotonic() - kill_times[-1], 2))
            previous = newest
            wait_for(log, f"parked {phase} {step}", proc)
            proc.send_signal(signal.SIGKILL)
            kill_times.append(time.monotonic())
        finally:
            proc.wait(60)
        assert proc.returncode == -signal.SIGKILL
        latest = find_latest(ckpt)
        assert latest is not None and latest.name == f"step_{newest:08d}", (phase, latest)
        torn = ckpt / f".tmp-step_{step + 1:08d}"
        if phase == "dcp":  # shards written, nothing else: must never be loaded
            assert (torn / "model").is_dir() and not (torn / "meta.json").exists()
        if phase == "fsync":  # every file written and synced, but not renamed: still ignored
            assert (torn / "meta.json").exists() and (torn / "state.pt").exists()
        if phase == "prune":  # renamed and pointed to: this one is complete
            assert (ckpt / "latest").read_text() == latest.name
    t0 = time.monotonic()
    proc = subprocess.Popen(base, env=env)
    try:
        wait_for(log, f"resume {previous}", proc)
        recovery_s.append(round(time.monotonic() - kill_times[-1], 2))
        assert proc.wait(300) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    final_run_s = time.monotonic() - t0

    runs: list[list[str]] = []
    for line in log.read_text().splitlines():
        if line.startswith("resume"):
            runs.append([])
        runs[-1].append(line)
    resumed_at = [int(r[0].split()[1]) for r in runs]
    assert resumed_at == [0, 3, 5, 7, 9]  # each restart picked the newest complete checkpoint
    assert runs[-1][-1] == "done"
    rows_by_step: dict[int, list[int]] = {}
    replayed = 0
    for run in runs:
        for line in run:
            if line.startswith("rows "):
                _, s, rows = line.split()
                values = [int(x) for x in rows.split(",")]
                if int(s) in rows_by_step:  # consumed by a killed run, not checkpointed: replayed
                    assert rows_by_step[int(s)] == values  # ... with exactly the same rows
                    replayed += 1
                rows_by_step[int(s)] = values
    assert rows_by_step == reference_rows(STEPS)  # no row repeated or skipped
    record("trainer_sigkill", kills=len(plan), kill_points=[p for p, _, _ in plan], resumed_from_steps=resumed_at[1:],
           torn_checkpoints_loaded=0, steps=STEPS, rows_replayed_after_kill=replayed * 2,
           rows_repeated_or_skipped=0, last_run_s=round(final_run_s, 1),
           recovery_s=recovery_s)


_IN_NAMESPACE = "AREAL_FULL_DISK_IN_USER_NAMESPACE"


def _rerun_in_a_user_namespace(request: pytest.FixtureRequest) -> None:
    """Run this one test again in a user + mount namespace, where a user without root may mount a
    tmpfs (``unshare --user --map-root-user --mount``), and check that it passed there."""
    cmd = ["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-m", "pytest", "-q",
           "-p", "no:cacheprovider", request.node.nodeid]
    env = {**os.environ, _IN_NAMESPACE: "1", "AREAL_RELIABILITY_RESULTS": str(RESULTS)}
    proc = subprocess.run(cmd, cwd=request.config.rootpath, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and re.search(r"^1 passed in ", proc.stdout, re.M), (
        f"the full-disk test needs root or unprivileged user namespaces (unshare); in a user namespace it gave "
        f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")


@pytest.fixture
def tiny_fs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path | None]:
    """A small, really full-able tmpfs; ``None`` when this user cannot mount one here and the test
    ran (and passed) in a user namespace instead."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    size = getattr(request, "param", "3m")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        assert not os.environ.get(_IN_NAMESPACE), f"cannot mount a tmpfs in the user namespace: {proc.stderr}"
        _rerun_in_a_user_namespace(request)
        yield None
        return
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> int:
    """Write zeros into ``path`` until the filesystem is full; returns the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as fh:
        try:
            while True:
                written += fh.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    try:  # fill the last partial block too
        with open(path, "ab", buffering=0) as fh:
            while True:
                written += fh.write(b"\0" * 512)
    except OSError:
        pass
    return written


def test_checkpoint_on_a_full_disk_fails_cleanly(model_dir: Path, tiny_fs: Path | None) -> None:
    from trainers.engine import TrainEngine

    if tiny_fs is None:  # it ran, and passed, in a user namespace
        return

    engine = TrainEngine(make_cfg(), model_dir)
    ckpt = Checkpointer(tiny_fs / "ckpt", keep=2)
    engine.train_batch(step_batch(0), nll_loss_fn)
    ckpt.save(engine, step=1, version=1, rollout={"row": 1})
    size = sum(f.stat().st_size for f in (tiny_fs / "ckpt").rglob("*") if f.is_file())
    filler = tiny_fs / "filler"
    filled = fill(filler)
    engine.train_batch(step_batch(1), nll_loss_fn)
    with pytest.raises(OSError) as info:  # not DCP's CheckpointException, a BaseException
        ckpt.save(engine, step=2, version=2, rollout={"row": 2})
    assert info.value.errno == errno.ENOSPC and "\n" not in str(info.value), str(info.value)
    assert find_latest(tiny_fs / "ckpt").name == "step_00000001"
    assert not (tiny_fs / "ckpt" / "step_00000002").exists()
    fresh = TrainEngine(make_cfg(), model_dir)
    state = ckpt.load_latest(fresh)  # the previous checkpoint still loads
    assert state is not None and state["step"] == 1 and state["rollout"] == {"row": 1}
    filler.unlink()  # space is back: the next save works and clears the torn temp dir
    ckpt.save(engine, step=2, version=2, rollout={"row": 2})
    assert find_latest(tiny_fs / "ckpt").name == "step_00000002"
    assert not list((tiny_fs / "ckpt").glob(".tmp-*"))
    record("checkpoint_full_disk", filesystem="tmpfs 3 MiB", checkpoint_bytes=size, filler_bytes=filled,
           save_error=str(info.value)[-60:], previous_checkpoint_loaded=True, next_save_after_freeing_ok=True)


@pytest.mark.parametrize("tiny_fs", ["64k"], indirect=True)
def test_rollout_jsonl_on_a_full_disk_keeps_a_valid_prefix(tiny_fs: Path | None) -> None:
    from areal_agents.types import Trajectory
    from trainers.rollout_only import write_rollouts

    if tiny_fs is None:  # it ran, and passed, in a user namespace
        return

    out = tiny_fs / "rollouts.jsonl"
    ex = make_executor()
    try:
        with pytest.raises(OSError) as info:
            write_rollouts(ex, 4000, out, progress=False, timeout=30)
        counts = ex.counts()
    finally:
        ex.shutdown()
    assert info.value.errno == errno.ENOSPC
    text = out.read_text()
    assert text.endswith("\n")  # no torn last line
    trajs = [Trajectory.from_json(line) for line in text.splitlines()]
    assert len(trajs) > 10 and len(trajs) % 2 == 0  # whole groups only
    assert counts["submitted"] == counts["accepted"] + counts["failed"] + counts["dropped"] + counts["in_flight"]
    record("rollout_jsonl_full_disk", filesystem="tmpfs 64 KiB", episodes_written=len(trajs),
           torn_lines=0, error="ENOSPC")
