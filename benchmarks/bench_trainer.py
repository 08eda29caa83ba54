"""Trainer throughput: a GRPO step on the tiny model with mixed-length sequences.

Compares the engine (length-sorted micro-batches under a token budget, global loss
normalisation) with a plain PyTorch loop that pads every sequence to the batch maximum and
runs forward + backward + AdamW on the same tokens in fixed-size row chunks. Each method runs
in its own subprocess (so peak RSS is its own); tokens/s counts real (unpadded) tokens.

    python benchmarks/bench_trainer.py [--steps 4] [--batch 64] [--device cpu] [--vocab 512]

``--vocab`` sets the model's vocabulary (real LLMs have 32k-152k entries: their output layer
and log-softmax, which the engine runs only at the trained tokens, then weigh much more).

Writes ``benchmarks/results/trainer.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "trainer.json"


def _lengths(n: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, response) lengths: prompts 16-48 tokens, long-tailed responses 8-400."""
    rng = random.Random(seed)
    return [(rng.randint(16, 48), min(400, 8 + int(rng.expovariate(1 / 60)))) for _ in range(n)]


def _trajectories(n: int, vocab: int, seed: int) -> list[Any]:
    from areal_agents.rollout.returns import settle_returns
    from areal_agents.types import Trajectory

    rng = random.Random(seed)
    out = []
    for i, (p, r) in enumerate(_lengths(n, seed)):
        ids = [rng.randrange(3, vocab) for _ in range(p + r)]
        t = Trajectory(input_ids=ids, loss_mask=[0] * p + [1] * r,
                       logprobs=[0.0] * p + [-rng.random() for _ in range(r)],
                       versions=[-1] * p + [0] * r, turn_spans=[(p, p + r)], group_id=f"g{i // 8}")
        t.set_rewards([float(rng.random() < 0.5)])
        settle_returns(t)
        out.append(t)
    return out


def _model_dir(root: Path, vocab: int) -> Path:
    """The tiny default architecture (hidden 128, 4 layers) with ``vocab`` entries, random weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, pad_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(root / "model")
    return root / "model"


def _peak_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_engine(model: str, args: argparse.Namespace) -> dict[str, Any]:
    from algorithms.specs import get_algorithm
    from areal_agents.config import ActorConfig, ExperimentConfig, TrainerConfig
    from trainers.engine import TrainEngine

    cfg = ExperimentConfig(actor=ActorConfig(max_tokens_per_mb=args.max_tokens_per_mb),
                           trainer=TrainerConfig(device=args.device, total_steps=args.steps + 1))
    spec = get_algorithm("grpo")
    engine = TrainEngine(cfg, model)
    out: dict[str, Any] = {"step_s": [], "train_s": []}
    for step in range(args.steps + 1):  # step 0 warms up
        trajs = _trajectories(args.batch, args.vocab, seed=step)
        t0 = time.perf_counter()
        batch = engine.to_batch(trajs)
        batch["prox_logp"] = engine.compute_logprobs(batch, 1.0)
        batch["advantages"] = spec.advantage_fn()(batch, cfg.algorithm)
        t1 = time.perf_counter()
        m = engine.train_batch(batch, spec.loss_fn(), temperature=1.0)
        t2 = time.perf_counter()
        if step:
            out["step_s"].append(t2 - t0)
            out["train_s"].append(t2 - t1)
            out["pad_ratio"], out["n_mbs"] = m["pad_ratio"], m["n_mbs"]
    return out


def run_plain(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Forward + backward + AdamW, every row padded to the batch maximum, fixed row chunks."""
    import torch
    from transformers import AutoModelForCausalLM

    dev = torch.device(args.device)
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(dev).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    out: dict[str, Any] = {"step_s": []}
    for step in range(args.steps + 1):
        trajs = _trajectories(args.batch, args.vocab, seed=step)
        t0 = time.perf_counter()
        t_max = max(len(t.input_ids) for t in trajs)
        ids = torch.zeros(len(trajs), t_max, dtype=torch.long)
        attn = torch.zeros_like(ids)
        mask = torch.zeros(len(trajs), t_max)
        adv = torch.tensor([t.reward - 0.5 for t in trajs])
        for i, t in enumerate(trajs):
            ids[i, : len(t.input_ids)] = torch.tensor(t.input_ids)
            attn[i, : len(t.input_ids)] = 1
            mask[i, : len(t.input_ids)] = torch.tensor(t.loss_mask, dtype=torch.float32)
        rows = max(1, args.max_tokens_per_mb // t_max)
        total = mask.sum()
        for s in range(0, len(trajs), rows):
            sl = slice(s, s + rows)
            logits = net(input_ids=ids[sl].to(dev), attention_mask=attn[sl].to(dev)).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[sl, 1:, None].to(dev))[..., 0]
            loss = -(logp * mask[sl, 1:].to(dev) * adv[sl, None].to(dev)).sum() / total
            loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step:
            out["step_s"].append(time.perf_counter() - t0)
            out["pad_ratio"] = 1.0 - float(attn.sum()) / (rows * t_max * -(-len(trajs) // rows))
    return out


def _child(args: argparse.Namespace) -> None:
    import torch

    torch.manual_seed(0)
    fn = run_engine if args.method == "engine" else run_plain
    res = fn(args.model, args)
    per_step = [sum(p + r for p, r in _lengths(args.batch, s)) for s in range(1, args.steps + 1)]
    res["tokens_per_step"] = per_step
    res["tokens_per_s"] = sum(per_step) / sum(res["step_s"])
    if "train_s" in res:
        res["train_tokens_per_s"] = sum(per_step) / sum(res["train_s"])
    res["peak_mem_mb"] = _peak_mb(args.device)
    res["threads"] = torch.get_num_threads()
    print("RESULT " + json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens-per-mb", type=int, default=4096)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, default=512, help="the model's vocabulary size")
    ap.add_argument("--method", choices=["engine", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args()
    if args.method:
        _child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = _model_dir(Path(tmp), args.vocab)
        results: dict[str, Any] = {}
        for method in ("plain", "engine"):
            cmd = [sys.executable, __file__, "--method", method, "--model", str(model), "--steps", str(args.steps),
                   "--batch", str(args.batch), "--max-tokens-per-mb", str(args.max_tokens_per_mb),
                   "--device", args.device, "--vocab", str(args.vocab)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ})
            line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
            results[method] = json.loads(line[len("RESULT "):])
            print(f"{method:>6}: {results[method]['tokens_per_s']:.0f} tokens/s, "
                  f"pad {results[method]['pad_ratio']:.2f}, peak {results[method]['peak_mem_mb']:.0f} MB")
    lengths = [p + r for p, r in _lengths(args.batch, 1)]
    report = {
        "benchmark": f"GRPO step, tiny Qwen2 (vocab {args.vocab}, hidden 128, 4 layers), mixed lengths",
        "vocab": args.vocab,
        "batch": args.batch, "steps": args.steps, "max_tokens_per_mb": args.max_tokens_per_mb,
        "seq_len_min_mean_max": [min(lengths), sum(lengths) / len(lengths), max(lengths)],
        "device": args.device, "cpus": os.cpu_count(), "platform": platform.platform(),
        "engine_tokens_per_s": results["engine"]["tokens_per_s"],
        "engine_train_only_tokens_per_s": results["engine"]["train_tokens_per_s"],
        "plain_padded_tokens_per_s": results["plain"]["tokens_per_s"],
        "speedup_engine_step_vs_plain": results["engine"]["tokens_per_s"] / results["plain"]["tokens_per_s"],
        "speedup_train_only_vs_plain": results["engine"]["train_tokens_per_s"] / results["plain"]["tokens_per_s"],
        "engine_peak_mem_mb": results["engine"]["peak_mem_mb"],
        "plain_peak_mem_mb": results["plain"]["peak_mem_mb"],
        "target": "≥ 1.0",  # length-sorted micro-batches should beat padding to the batch maximum
        "meets_target": results["engine"]["train_tokens_per_s"] >= results["plain"]["tokens_per_s"],
        "raw": results,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"engine step (with logprob recompute) {report['speedup_engine_step_vs_plain']:.2f}x, "
          f"train only {report['speedup_train_only_vs_plain']:.2f}x the padded loop -> {out}")


if __name__ == "__main__":
    main()
