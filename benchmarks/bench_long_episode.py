"""Long episodes: the trainer's memory per token of one long episode, with and without activation checkpointing.

For each length in ``--lengths`` and each checkpointing setting, a fresh process builds a Qwen2
model of the tiny default model's shape (``--hidden`` × ``--layers``, positions enough for the
longest episode), a real :class:`~trainers.engine.TrainEngine` (``actor.max_tokens_per_mb`` = the
length), runs one warm-up step on a short episode, then trains one step on one episode of that
many tokens (a prompt, then generated turns). The figure is the growth of the process's peak
resident memory over the long step, divided by the length: memory per token (the activations
kept for the backward pass, and attention's work space). Seconds for the step are printed too.

    python benchmarks/bench_long_episode.py [--lengths 1024 2048 4096 8192] [--hidden 128] [--layers 4]

Writes ``benchmarks/results/long_episode.json``. Target: checkpointing costs less memory per token.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

_ONE = """
import json, random, resource, sys, tempfile, time
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from areal_agents.config import ActorConfig, ExperimentConfig, TrainerConfig
from areal_agents.types import Trajectory
from trainers.engine import TrainEngine
from trainers.sft import sft_loss

length, hidden, layers, ckpt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "on"
torch.set_num_threads(1)
cfg = Qwen2Config(vocab_size=283, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max(length, 64),
                  pad_token_id=0, eos_token_id=2, bos_token_id=1, tie_word_embeddings=True)
torch.manual_seed(0)
path = tempfile.mkdtemp()
Qwen2ForCausalLM(cfg).save_pretrained(path)
exp = ExperimentConfig(actor=ActorConfig(lr=1e-4, max_tokens_per_mb=max(length, 64), gradient_checkpointing=ckpt),
                       trainer=TrainerConfig(total_steps=10))
engine = TrainEngine(exp, path)

def episode(n):
    rng = random.Random(n)
    prompt = n // 8
    mask = [0] * prompt + [1] * (n - prompt)
    return Trajectory(input_ids=[rng.randrange(3, 283) for _ in range(n)], loss_mask=mask,
                      logprobs=[-1.0 if m else 0.0 for m in mask], versions=[0 if m else -1 for m in mask],
                      turn_spans=[(prompt, n)], group_id="g")

engine.train_batch([episode(64)], sft_loss, temperature=1.0, n_minibatches=1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
engine.train_batch([episode(length)], sft_loss, temperature=1.0, n_minibatches=1)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"length": length, "checkpointing": ckpt, "peak_growth_mb": (peak - before) / 1024,
                  "kb_per_token": (peak - before) / length, "seconds": seconds}))
"""


def measure(length: int, hidden: int, layers: int, checkpointing: bool) -> dict[str, float]:
    """One long step in a fresh process (its peak memory is its own)."""
    proc = subprocess.run([sys.executable, "-c", _ONE, str(length), str(hidden), str(layers),
                           "on" if checkpointing else "off"], capture_output=True, text=True, cwd=ROOT, timeout=1800,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"error: the {length}-token step failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--output", type=Path, default=RESULTS / "long_episode.json")
    args = parser.parse_args(argv)
    rows = []
    for length in args.lengths:
        for ckpt in (False, True):
            row = measure(length, args.hidden, args.layers, ckpt)
            rows.append(row)
            print(f"{length:>6} tokens, checkpointing {'on ' if ckpt else 'off'}: peak +{row['peak_growth_mb']:8.1f} MB "
                  f"({row['kb_per_token']:6.1f} kB/token), {row['seconds']:6.2f} s", flush=True)
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
              "hidden": args.hidden, "layers": args.layers, "rows": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
