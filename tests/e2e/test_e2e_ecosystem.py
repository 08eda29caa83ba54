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
from areal_agents.inference.tiny_model import build_tiny_model

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


@pytest.mark.parametrize("name", sorted(CASES))
def test_ecosystem_env_trains(tmp_path: Path, name: str) -> None:
    overrides, prompt_text = CASES[name]
    model = build_tiny_model(_texts(name, overrides), tmp_path / "model", max_position_embeddings=2048)
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = ["run", "--env", name, *overrides, f"actor.path={model}", f"output_dir={tmp_path / 'runs'}",
            "experiment_name=eco", "rollout.batch_size=2", "rollout.group_size=4", "sampling.max_new_tokens=6",
            "eval.n=4", "eval.every=0", "logging.progress=false", f"trainer.total_steps={STEPS}",
            "logging.plots=false", "data.train_size=64", "data.test_size=8"]
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", *args], capture_output=True, text=True,
                          timeout=800, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "eco" / "trial"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["version"] for r in train] == list(range(1, STEPS + 1))
    for r in train:
        assert r["rollout/accepted"] >= 8
        assert not any(k.startswith("rollout/failed/") and v for k, v in r.items()), r
    if name == "textarena":  # a game of several replies (GEM's games end at the first reply without a
        assert max(r["rollout/turns"] for r in train) > 1.0  # \\boxed{} move, as the untrained model's are)
    assert any("eval/accuracy" in r for r in rows)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(prompt_text in s["prompt"] for s in samples)


def test_a_game_without_a_model_says_so_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "run", "--env", "textarena",
                           f"output_dir={tmp_path / 'runs'}", "logging.progress=false"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: actor.path: env 'textarena' gives no reference_completion for its rows, so the tiny default model "
        "cannot be warm-started on it: set actor.path to a model"]
