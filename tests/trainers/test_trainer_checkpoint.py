"""Checkpoint/recover: exact resume, atomic saves, SIGKILL mid-run, SIGTERM-triggered save."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainer_helpers import make_cfg, nll_loss_fn, step_batch, tiny_qwen

from trainers.checkpoint import Checkpointer, CheckpointMismatch, find_latest
from trainers.engine import TrainEngine

HELPERS = Path(__file__).with_name("trainer_helpers.py")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen(tmp_path_factory.mktemp("tiny") / "model")


def test_resume_gives_the_same_next_losses(model_dir: Path, tmp_path: Path) -> None:
    cfg = make_cfg()
    cfg.actor.lr_schedule, cfg.actor.warmup_steps = "cosine", 2  # the schedule position must be restored
    engine = TrainEngine(cfg, model_dir)
    torch.manual_seed(0)
    for s in range(2):
        engine.train_batch(step_batch(s), nll_loss_fn)
    ckpt = Checkpointer(tmp_path / "ckpt")
    path = ckpt.save(engine, step=2, version=7, rollout={"row": 2})
    want = [engine.train_batch(step_batch(s), nll_loss_fn) for s in (2, 3)]

    fresh = TrainEngine(cfg, model_dir)
    torch.manual_seed(123)  # disturbed RNG: the checkpoint must restore it
    state = ckpt.load_latest(fresh)
    assert state is not None and state["path"] == str(path)
    assert (state["step"], state["version"], state["rollout"]) == (2, 7, {"row": 2})
    got = [fresh.train_batch(step_batch(s), nll_loss_fn) for s in (2, 3)]
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-6)
        assert g["lr"] == pytest.approx(w["lr"], rel=1e-9)
    assert fresh.step == engine.step == 4


def test_half_written_checkpoints_are_ignored(model_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    engine = TrainEngine(make_cfg(), model_dir)
    ckpt = Checkpointer(root, keep=2)
    assert find_latest(root) is None and ckpt.load_latest(engine) is None
    for step in (1, 2, 3):
        ckpt.save(engine, step=step, version=step)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000002", "step_00000003"]  # keep=2
    assert (root / "latest").read_text() == "step_00000003"
    # A crash mid-save: a temp dir, and a renamed dir whose meta.json never got written.
    (root / ".tmp-step_00000005" / "model").mkdir(parents=True)
    torn = root / "step_00000004"
    torn.mkdir()
    (torn / "state.pt").write_bytes(b"partial")
    (torn / "meta.json").write_text('{"step": 4, "vers')
    assert find_latest(root) == root / "step_00000003"
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        ckpt.load(engine, torn)
    assert ckpt.load_latest(engine)["step"] == 3


def test_checkpoints_of_another_run_are_refused(model_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    engine = TrainEngine(make_cfg(), model_dir)
    mine = {"env": "math", "model": str(model_dir), "algorithm": "grpo"}
    Checkpointer(root, fingerprint=mine).save(engine, step=3, version=3)
    assert Checkpointer(root, fingerprint=dict(mine)).latest() == root / "step_00000003"
    other = Checkpointer(root, fingerprint={**mine, "env": "countdown"})
    with pytest.raises(CheckpointMismatch, match=r"env 'math' \(now 'countdown'\)") as info:
        other.load_latest(engine)
    assert "\n" not in str(info.value)
    assert Checkpointer(root).latest() == root / "step_00000003"  # no fingerprint asked: any checkpoint


def test_starting_over_sets_an_earlier_runs_checkpoints_aside(model_dir: Path, tmp_path: Path) -> None:
    """``trainer.recover=disabled`` beside a finished run's steps 9 and 10: the new run's steps 1-3
    stay (keep=2 would otherwise delete them in favour of 9 and 10), and a later resume picks its
    own step 3, not the old 10; the old checkpoints are kept beside, not deleted."""
    root = tmp_path / "checkpoints"
    engine = TrainEngine(make_cfg(), model_dir)
    for step in (9, 10):
        Checkpointer(root).save(engine, step=step, version=step)
    again = Checkpointer(root)
    assert again.resume_point("auto") == root / "step_00000010"
    assert again.resume_point("disabled") is None
    for step in (1, 2, 3):
        again.save(engine, step=step, version=step)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000002", "step_00000003"]
    assert Checkpointer(root).resume_point("auto") == root / "step_00000003"
    aside = tmp_path / "checkpoints.set-aside-1"
    assert sorted(p.name for p in aside.glob("step_*")) == ["step_00000009", "step_00000010"]
    assert Checkpointer(root).resume_point("disabled") is None  # a second start-over: a second folder
    assert (tmp_path / "checkpoints.set-aside-2" / "step_00000003").is_dir() and not root.exists()
    assert Checkpointer(root).resume_point("disabled") is None  # nothing to set aside
    shutil.rmtree(aside)  # a user deleted the first: the next goes after the highest left, not into it
    Checkpointer(root).save(engine, step=1, version=1)
    assert Checkpointer(root).resume_point("disabled") is None
    assert (tmp_path / "checkpoints.set-aside-3" / "step_00000001").is_dir()


def test_sigterm_requests_a_save(model_dir: Path, tmp_path: Path) -> None:
    engine = TrainEngine(make_cfg(), model_dir)
    ckpt = Checkpointer(tmp_path / "ckpt")
    step = 0
    before = signal.getsignal(signal.SIGTERM)
    with ckpt.save_on_sigterm(lambda: (engine, step, step, {"row": step})):
        for s in range(10):
            if ckpt.stop_requested():
                break
            engine.train_batch(step_batch(s), nll_loss_fn)
            step = s + 1
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the process survives: the handler only flags
    assert step == 2
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
    latest = find_latest(tmp_path / "ckpt")
    assert latest is not None and latest.name == "step_00000002"


def _losses(path: Path) -> dict[int, float]:
    out = {}
    for line in path.read_text().splitlines():
        step, loss = line.split()
        out[int(step)] = float(loss)
    return out


def test_sigkill_then_recover_matches_uninterrupted_run(model_dir: Path, tmp_path: Path) -> None:
    steps = 8
    ref_file, run_file = tmp_path / "ref.txt", tmp_path / "run.txt"
    base = [sys.executable, str(HELPERS), str(model_dir)]
    subprocess.run([*base, str(tmp_path / "ref_ckpt"), str(ref_file), str(steps), "0"], check=True, timeout=600)
    reference = _losses(ref_file)
    assert sorted(reference) == list(range(steps))

    proc = subprocess.Popen([*base, str(tmp_path / "ckpt"), str(run_file), str(steps), "0.5"])
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if run_file.exists() and len(run_file.read_text().splitlines()) >= 5:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)  # no handler runs: whatever was being written is torn
    finally:
        proc.wait(timeout=60)
    killed_at = len(run_file.read_text().splitlines())
    assert killed_at < steps
    resumed_from = find_latest(tmp_path / "ckpt")
    assert resumed_from is not None

    subprocess.run([*base, str(tmp_path / "ckpt"), str(run_file), str(steps), "0"], check=True, timeout=600)
    lines = run_file.read_text().splitlines()
    second = [(int(a), float(b)) for a, b in (ln.split() for ln in lines[killed_at:])]
    assert second[0][0] <= killed_at and second[-1][0] == steps - 1  # resumed from a checkpoint, not from 0
    assert second[0][0] >= 2
    for step, loss in second:
        assert loss == pytest.approx(reference[step], rel=1e-6), step
