"""Rollout-only mode end to end: `areal-agents run mode=rollout` writes trajectory JSONL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from areal_agents.types import Trajectory
from trainers.tiny_model import build_tiny_model


def test_cli_rollout_mode_writes_jsonl(tmp_path: Path) -> None:
    texts = [f"What is {a} + {b}? The answer is {a + b}." for a in range(30) for b in range(30)]
    model = build_tiny_model(texts, tmp_path / "model")
    out = tmp_path / "rollouts.jsonl"
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", "mode=rollout",
           f"actor.path={model}", "rollout.num_episodes=7", "rollout.batch_size=2", "rollout.group_size=2",
           f"rollout.output_path={out}", f"output_dir={tmp_path / 'runs'}", "logging.tensorboard=false",
           "sampling.max_new_tokens=8"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trajs = [Trajectory.from_json(line) for line in out.read_text().splitlines()]
    assert len(trajs) == 8  # 7 episodes rounded up to whole groups of 2
    assert "(mode=rollout)" in proc.stdout and "episodes written" in proc.stdout
    assert len({t.group_id for t in trajs}) == 4
    for t in trajs:
        t.validate()
        assert t.status == "ok" and 0 < t.num_generated <= 8 and t.start_version == 0
        assert set(v for v, m in zip(t.versions, t.loss_mask, strict=True) if m) == {0}
