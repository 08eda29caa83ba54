"""End to end: an env of each library behind the ecosystem extras (reasoning-gym, TextArena,
GEM) trains a few steps through ``areal-agents run`` on the tiny model, with no failed
episode, by name alone (``--env NAME env.kwargs.KEY=VALUE``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_agents import make_env
from trainers.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

STEPS = 2

CASES = {  # env -> (overrides, what every sample's prompt holds)
    "reasoning-gym": (["env.kwargs.task=chain_sum"], "arithmetic problem"),
    "textarena": (["env.kwargs.game=GuessTheNumber-v0", "env.kwargs.max_turns=2", "agent.max_turns=2"],
                  "Guess The Number"),
    "gem": (["env.kwargs.env_id=game:GuessTheNumber-v0-easy", "env.kwargs.max_turns=2", "agent.max_turns=2"],
            "Guess The Number"),
}


def _texts(name: str, overrides: list[str]) -> list[str]:
    """What the tiny model's tokenizer learns from: the env's first observations, and replies."""
    kwargs = {o.split("=", 1)[0].removeprefix("env.kwargs."): o.split("=", 1)[1]
              for o in overrides if o.startswith("env.kwargs.")}
    kwargs = {k: int(v) if v.isdigit() else v for k, v in kwargs.items()}
    env = make_env(name, **kwargs)
    try:
        texts = [str(env.reset(seed=seed)[0]) for seed in range(40)]
    finally:
        env.close()
    return texts + [f"[{n}] \\boxed{{{n}}} {n}" for n in range(100)]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``areal-agents ARGS`` with its cache and runs under ``tmp_path``."""
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "areal_agents.cli", *args, f"output_dir={tmp_path / 'runs'}",
                           "experiment_name=eco", "logging.progress=false"],
                          capture_output=True, text=True, timeout=800, env=env, cwd=tmp_path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_ecosystem_env_trains(tmp_path: Path, name: str) -> None:
    overrides, prompt_text = CASES[name]
    model = build_tiny_model(_texts(name, overrides), tmp_path / "model", max_position_embeddings=2048)
    proc = _cli(tmp_path, "run", "--env", name, *overrides, f"actor.path={model}", "rollout.batch_size=2",
                "rollout.group_size=4", "sampling.max_new_tokens=6", "eval.n=4", "eval.every=0",
                f"trainer.total_steps={STEPS}", "logging.plots=false", "data.train_size=64", "data.test_size=8")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "eco" / "trial"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "train/loss" in m]
    assert [m["version"] for m in steps] == list(range(1, STEPS + 1))
    assert min(m["rollout/accepted"] for m in steps) >= 8
    failed = {k: v for m in steps for k, v in m.items() if k.startswith("rollout/failed/") and v}
    assert not failed
    if name == "textarena":  # a game of several replies (GEM's games end at the first reply without a
        assert max(m["rollout/turns"] for m in steps) > 1.0  # \boxed{} move, as the untrained model's are)
    assert any("eval/accuracy" in m for m in metrics)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(prompt_text in s["prompt"] for s in samples)


def test_a_game_without_a_model_says_so_in_one_line(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "run", "--env", "textarena")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: actor.path: env 'textarena' gives no reference_completion for its rows, so the tiny default model "
        "cannot be warm-started on it: set actor.path to a model"]
