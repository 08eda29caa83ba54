"""Rollout-only mode end to end: `areal-agents run mode=rollout` writes trajectory JSONL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


# An agent that notes, in the file that $PREFLIGHT_LOG names, each episode it plays and the model
# it plays against: the preflight check's scripted model, or the inference servers' client.
NOTING_AGENT = '''\
import os

from areal_agents import ChatAgent, register_agent


@register_agent("noting")
class NotingAgent(ChatAgent):
    async def run(self, env, llm, row=None, *, seed=None):
        with open(os.environ["PREFLIGHT_LOG"], "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {type(llm).__name__}\\n")
        return await super().run(env, llm, row, seed=seed)
'''


@pytest.mark.slow
def test_preflight_runs_once_when_the_run_relaunches_itself_on_two_ranks(tmp_path: Path) -> None:
    """``trainer.nproc=2``: the command re-enters itself under torchrun; its ranks go straight to the
    trainer, so the user's agent meets the scripted model once in the whole run."""
    texts = [f"What is {a} + {b}? The answer is {a + b}." for a in range(30) for b in range(30)]
    model = build_tiny_model(texts, tmp_path / "model")
    (tmp_path / "noting_agent.py").write_text(NOTING_AGENT)
    log = tmp_path / "episodes.log"
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", "mode=rollout", "imports=noting_agent.py",
           "agent.name=noting", "trainer.nproc=2", f"actor.path={model}", "rollout.num_episodes=4",
           "rollout.batch_size=2", "rollout.group_size=2", f"output_dir={tmp_path / 'runs'}", "logging.progress=false",
           "logging.tensorboard=false", "sampling.max_new_tokens=8"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PREFLIGHT_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    models = [line.split()[1] for line in log.read_text().splitlines()]
    assert models.count("ScriptedLLM") == 1, models
    assert len(models) > 1 and set(models) == {"ScriptedLLM", "ClientLLM"}, models  # the rollout's episodes too
