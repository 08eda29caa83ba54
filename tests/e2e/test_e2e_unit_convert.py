"""End to end: ``areal-agents run --env unit-convert`` through the real path (embedded server, the
default OpenAI-client agent, the trainer): episodes call the tool, the tool's result is in the
trajectory as context (loss mask 0), and a few RL steps train with finite losses."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_agents.config import SFTConfig
from areal_agents.config.loader import load_config
from areal_agents.data import load_dataset_rows
from trainers.batching import load_trajectories
from trainers.sft import render_examples, sft_train
from trainers.tiny_corpus import corpus_text
from trainers.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

STEPS = 3


def _tool_calling_model(root: Path) -> Path:
    """A tiny model fine-tuned briefly on the env's reference conversations: it writes tool calls."""
    from transformers import AutoTokenizer

    cfg = load_config(None, ["env.name=unit-convert"])
    from areal_agents.gym.registration import make_env

    env = make_env("unit-convert")
    rows = load_dataset_rows(cfg, "train")[:400]
    base = build_tiny_model([corpus_text(env, r) for r in rows], root / "base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    examples, _ = render_examples(cfg, tokenizer, env, rows)
    sft_train(base, examples, SFTConfig(steps=120, batch_size=16, lr=3e-3, warmup_steps=10, eval_every=0),
              root / "sft", cfg=cfg, tokenizer=tokenizer, progress=False)
    return root / "sft"


def _run(tmp_path: Path, model: Path, *extra: str) -> None:
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = ["run", "--env", "unit-convert", f"actor.path={model}", f"output_dir={tmp_path / 'runs'}",
            "rollout.batch_size=2", "rollout.group_size=4", "eval.n=8", "eval.every=0", "logging.progress=false",
            "logging.plots=false", "trainer.save_every=0", *extra]
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", *args], capture_output=True, text=True,
                          timeout=900, env=env, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_unit_convert_trains_through_the_openai_path(tmp_path: Path) -> None:
    model = _tool_calling_model(tmp_path)
    out = tmp_path / "rollouts.jsonl"
    _run(tmp_path, model, "mode=rollout", "rollout.num_episodes=16", f"rollout.output_path={out}",
         "experiment_name=uc-rollout")
    trajs = [t for t in load_trajectories(out) if t.status == "ok"]
    assert len(trajs) >= 16
    called = [t for t in trajs if t.info.get("num_calls") == 2]  # a tool call, then an answer
    assert called, [t.info for t in trajs[:3]]
    for t in called:
        assert t.num_turns == 2 and not t.segments  # the answer's call extends the tool call's
        (_, first_end), (second, _) = t.turn_spans
        assert not any(t.loss_mask[first_end:second]) and all(v == -1 for v in t.versions[first_end:second])
        assert all(all(t.loss_mask[a:b]) for a, b in t.turn_spans)
        assert t.completion_text.startswith('<tool_call>{"name": "convert"')  # the first reply: the call
    _run(tmp_path, model, f"trainer.total_steps={STEPS}", "experiment_name=uc-train")
    rows = [json.loads(line) for line in (tmp_path / "runs" / "uc-train" / "trial" / "metrics.jsonl").read_text()
            .splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["version"] for r in train] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["train/loss"]) and r["rollout/accepted"] >= 8 for r in train)
    assert not any(k.startswith("rollout/failed/") and v for r in train for k, v in r.items())
