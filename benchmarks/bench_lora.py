"""LoRA vs full fine-tuning on the trainer: step time, peak memory, optimiser state and weight-sync payload.

Each variant runs in a fresh process (so its peak RSS is its own): the engine on a tiny Qwen2
(``--hidden``/``--layers``), ``--steps`` training steps on a fixed batch of 64 sequences, then
the disk sync's export (what ``/update_weights_from_disk`` or ``/load_lora_adapter`` reads) and
the broadcast payload (the tensors the gloo/NCCL path sends). Prints one JSON line per variant
and a table::

    python benchmarks/bench_lora.py [--steps 10] [--hidden 256] [--layers 4] [--rank 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _model(root: Path, hidden: int, layers: int) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                      tie_word_embeddings=True, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(root / "model")
    return root / "model"


def _one(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import random

    import torch

    from areal_agents.config import ActorConfig, ExperimentConfig, LoraConfig
    from areal_agents.types import Trajectory
    from trainers.engine import TrainEngine
    from trainers.sft import sft_loss

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    path = _model(root, args.hidden, args.layers)
    lora = LoraConfig(rank=args.rank, alpha=2.0 * args.rank) if variant == "lora" else LoraConfig()
    cfg = ExperimentConfig(actor=ActorConfig(lr=1e-3, lora=lora))
    engine = TrainEngine(cfg, path, critic=False)
    rng = random.Random(0)
    batch = []
    for _ in range(64):
        ids = [rng.randrange(2, 512) for _ in range(96)]
        batch.append(Trajectory(input_ids=ids, loss_mask=[0] * 32 + [1] * 64, logprobs=[0.0] * 96, versions=[0] * 96))
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        engine.train_batch(batch, sft_loss, temperature=1.0, n_minibatches=1)
        times.append(time.perf_counter() - t0)
    opt = engine.actor.optimizer
    assert opt is not None
    optim_bytes = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor) and t.dim() > 0)
    t0 = time.perf_counter()
    out = engine.export_hf(root / "sync")
    export_s = time.perf_counter() - t0
    disk_bytes = sum(f.stat().st_size for f in out.iterdir() if f.suffix == ".safetensors")
    t0 = time.perf_counter()
    state = engine.full_state_dict() if variant == "full" else engine.adapter_state_dict()
    gather_s = time.perf_counter() - t0
    params = sum(p.numel() for p in engine.actor.model.parameters())
    trainable = sum(p.numel() for g in opt.param_groups for p in g["params"])
    return {"variant": variant, "params": params, "trainable": trainable,
            "step_s_median": statistics.median(times[1:] or times), "optim_state_bytes": optim_bytes,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "sync_disk_bytes": disk_bytes, "sync_export_s": export_s,
            "sync_broadcast_bytes": sum(t.numel() * t.element_size() for t in state.values()),
            "sync_gather_s": gather_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--one", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args)))
        return 0
    rows = []
    for variant in ("full", "lora"):
        cmd = [sys.executable, __file__, "--one", variant, "--steps", str(args.steps), "--hidden", str(args.hidden),
               "--layers", str(args.layers), "--rank", str(args.rank)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| | params trained | step (median) | peak RSS | optimiser state | disk sync | broadcast |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['trainable']:,} of {r['params']:,} | {r['step_s_median']:.3f} s | "
              f"{r['peak_rss_mb']:.0f} MB | {r['optim_state_bytes'] / 1e6:.2f} MB | "
              f"{r['sync_disk_bytes'] / 1e6:.2f} MB in {r['sync_export_s']:.3f} s | "
              f"{r['sync_broadcast_bytes'] / 1e6:.2f} MB |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
