"""examples/gsm8k_grpo: the CPU smoke config trains on the shipped GSM8K-format data; the GPU config validates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from examples_support import ROOT, TINY, run_command, train_steps

from areal_agents.config.loader import load_config
from areal_agents.data import gsm8k_dataset

EXAMPLE = ROOT / "examples" / "gsm8k_grpo"


def test_shipped_gsm8k_data_is_well_formed() -> None:
    train = gsm8k_dataset("train", path=str(EXAMPLE / "data" / "{split}.jsonl"))
    test = gsm8k_dataset("test", path=str(EXAMPLE / "data" / "{split}.jsonl"))
    assert len(train) + len(test) >= 40 and len(test) >= 8
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    for row in train + test:  # every worked step is right and ends on the final answer
        lines = row["solution"].splitlines()
        for step in lines[:-1]:
            lhs, rhs = step.split("=")
            assert eval(lhs, {"__builtins__": {}}) == int(rhs), step  # noqa: S307 - our own data
        assert lines[-1] == f"#### {row['answer']}" and lines[-2].endswith(f"= {row['answer']}")


def test_gpu_config_validates_apart_from_the_sglang_install() -> None:
    cfg = load_config(str(EXAMPLE / "gpu.yaml"), ["inference.backend=embedded"])
    assert cfg.actor.dtype == "bfloat16" and cfg.sglang.dtype == "bfloat16"
    assert cfg.trainer.device == "cuda" and cfg.data.name == "gsm8k" and cfg.algorithm.name == "decoupled-ppo"
    assert cfg.actor.path and "Qwen2.5" in cfg.actor.path
    proc = subprocess.run([sys.executable, "-m", "areal_agents.cli", "config", "check", "--config",
                           str(EXAMPLE / "gpu.yaml")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    try:
        import sglang  # noqa: F401
    except ImportError:  # without SGLang the backend check is the one-line error, nothing else
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            "error: inference.backend: backend 'sglang' needs sglang >= 0.4.9.post2: pip install 'areal-agents[sglang]'"]
    else:
        assert proc.returncode == 0, proc.stderr


def test_cpu_smoke_config_trains_on_the_shipped_data(tmp_path: Path) -> None:
    run_command(["areal-agents", "run", "--config", "examples/gsm8k_grpo/cpu_smoke.yaml", *TINY,
                 f"output_dir={tmp_path / 'runs'}"], tmp_path)
    run_dir = tmp_path / "runs" / "gsm8k-grpo" / "cpu-smoke"
    steps = train_steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["version"] == 2
    assert (run_dir / "final" / "model.safetensors").is_file()
    questions = {json.loads(line)["question"] for line in (EXAMPLE / "data" / "train.jsonl").read_text().splitlines()}
    prompts = [json.loads(line)["prompt"] for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert prompts and all(any(q in p for q in questions) for p in prompts)
