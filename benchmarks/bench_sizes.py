"""Real sizes: Qwen2.5-0.5B- and 1.5B-shaped models with random weights through the trainer, weight sync and server.

For each size a Qwen2 config of the public checkpoint's shape is built (no download: random
weights in bfloat16, the project's offline tokenizer: its few hundred ids fit the model's
151,936-entry vocabulary), then:

1. ``train``: the project's :class:`~trainers.engine.TrainEngine` (FSDP2, world size 1, bf16
   parameters and compute, gradients reduced in float32, as the RL run builds it) trains
   ``--steps`` steps (after one warm-up step) on ``--batch`` random-token sequences of
   ``--seq-len`` tokens each, every token but the first trained (SFT loss), one full sequence
   per micro-batch (``actor.max_tokens_per_mb = --seq-len``: packed, no padding); activation
   checkpointing off, then on, each in a fresh engine. Reports tokens/s, MFU (and HFU),
   peak memory (``torch.cuda.max_memory_allocated``; on a CPU the process's peak RSS so far).
2. ``sync``: the full model from the last engine to one embedded server by disk and by gloo
   broadcast (``trainer.weight_sync``, made as a run makes it), a warm-up round then ``--repeats``
   timed rounds; the server's weight version is checked after every sync.
3. ``decode``: that server's decode tokens/s (``--requests`` concurrent ``/generate`` requests of
   ``--new-tokens``) against one batched ``model.generate`` (``bench_inference_server``'s rounds).

MFU: model FLOPs (:func:`train_flops_per_token`) over the GPU's peak dense bf16 FLOP/s
(:data:`PEAK_BF16_FLOPS`); target >= 40 % at 1.5B on one H100/H200. ``--sizes mini``: a
2-layer miniature of the same architecture (the CPU dry run).

    python benchmarks/bench_sizes.py [--sizes 1.5b 0.5b] [--device cuda] [--seq-len 4096] [--batch 4]
        [--steps 3] [--parts train sync decode] [--budget 270] [--output FILE]   # results/sizes.json
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import platform
import re
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bench_inference_server as bis  # its decode rounds (this directory is on sys.path: a script's own)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "sizes.json"
MFU_TARGET = {"size": "1.5b", "mfu_min": 0.40}


@dataclass(frozen=True)
class Arch:
    """The shape of a Qwen2 decoder (biases on q/k/v, RMSNorm, SwiGLU MLP, GQA, rotary positions)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True
    positions: int = 32768  # the published context; the models are built with at least the benchmark's length

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B config.json (both: vocab 151936, tied embeddings,
# rope_theta 1e6, rms_norm_eps 1e-6); parameters as published: 0.49B and 1.54B.
SIZES = {
    "0.5b": Arch(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936),
    "1.5b": Arch(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936),
    "mini": Arch(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, vocab=1024, positions=512),
}
EXPECTED_PARAMS = {"0.5b": 494_032_768, "1.5b": 1_543_714_304}

# Peak dense (no sparsity) bf16 tensor-core FLOP/s from the vendors' data sheets, matched
# against torch.cuda.get_device_name() in order (the first match wins).
PEAK_BF16_FLOPS: list[tuple[str, str, float]] = [
    (r"H200 NVL", "H200 NVL", 835e12),
    (r"GH200|H200", "H200 SXM", 989e12),
    (r"H100 PCIE", "H100 PCIe", 756e12),
    (r"H100 NVL", "H100 NVL", 835e12),
    (r"H100|H800", "H100 SXM", 989e12),
    (r"A100|A800", "A100", 312e12),
    (r"L40S", "L40S", 362e12),
    (r"\bL4\b", "L4", 121e12),
]


def qwen2_config(arch: Arch, *, max_positions: int | None = None, **ids: int) -> Any:
    """transformers' ``Qwen2Config`` of ``arch`` (``ids``: bos/eos/pad token ids)."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=arch.vocab, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
                       num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
                       num_key_value_heads=arch.kv_heads, max_position_embeddings=max_positions or arch.positions, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=arch.tied, use_sliding_window=False, **ids)  # fmt: skip


def matmul_params(arch: Arch) -> int:
    """Weights that multiply activations: per layer q/k/v/o and the MLP's gate/up/down, plus the
    output head (vocab × hidden; with tied embeddings the embedding matrix, counted once, as the
    head: the input lookup is no matmul). Biases and norms are left out."""
    d_q, d_kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    per_layer = arch.hidden * d_q + 2 * arch.hidden * d_kv + d_q * arch.hidden + 3 * arch.hidden * arch.intermediate
    return arch.layers * per_layer + arch.vocab * arch.hidden


def param_count(arch: Arch) -> int:
    """All parameters, as ``model.parameters()`` counts them (tied embeddings once)."""
    d_kv = arch.kv_heads * arch.head_dim
    biases_norms = arch.heads * arch.head_dim + 2 * d_kv + 2 * arch.hidden  # q/k/v biases, 2 RMSNorms
    embeddings = arch.vocab * arch.hidden * (1 if arch.tied else 2)
    return matmul_params(arch) - arch.vocab * arch.hidden + arch.layers * biases_norms + arch.hidden + embeddings


def train_flops_per_token(arch: Arch, seq_len: int, *, recompute: bool = False) -> float:
    """Training FLOPs per token of a causal sequence of ``seq_len`` tokens:

        6 · N_mm + 6 · L · d_q · (S + 1)

    A forward pass costs 2 FLOPs (multiply, add) per matmul weight per token: 2 · N_mm
    (:func:`matmul_params`: layers and output head, no embedding lookup, no biases or norms).
    Attention adds, per layer, Q·Kᵀ and A·V over the keys a query sees: 2 · 2 · d_q FLOPs per
    key, and with a causal mask query ``i`` sees ``i + 1`` keys, ``(S + 1) / 2`` on average:
    2 · L · d_q · (S + 1) (d_q = heads × head_dim; PaLM's appendix counts all ``S`` keys,
    12 · L · d_q · S in total, so its MFU reads higher). Backward costs twice the forward, so
    training is 3 × forward: the model FLOPs of MFU. ``recompute``: activation checkpointing runs
    each decoder layer's forward again in the backward pass (not the output head); those are
    hardware FLOPs (HFU), not model FLOPs. Softmax, norms and the loss are not counted.
    """
    mm_layers = matmul_params(arch) - arch.vocab * arch.hidden
    attention_fwd = 2 * arch.layers * arch.heads * arch.head_dim * (seq_len + 1)
    forward = 2 * matmul_params(arch) + attention_fwd
    return float(3 * forward + (2 * mm_layers + attention_fwd if recompute else 0))


def peak_flops(device_name: str) -> tuple[float | None, str]:
    """``(peak dense bf16 FLOP/s, the table's name)`` for a device name, or ``(None, why)``."""
    if device_name.lower() == "cpu":
        return None, "cpu: no peak FLOP/s in the table (MFU is reported for GPUs)"
    for pattern, name, flops in PEAK_BF16_FLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return flops, name
    return None, f"unknown device {device_name!r}: no peak bf16 FLOP/s for it in PEAK_BF16_FLOPS"


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | None) -> float | None:
    """Achieved FLOP/s over the peak; None without a peak."""
    return None if not peak else tokens_per_s * flops_per_token / peak


def build_model_dir(arch: Arch, out: Path, device: str, seq_len: int) -> Path:
    """Random bf16 weights of ``arch`` and the project's offline tokenizer, as an HF model dir."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from trainers.tiny_model import BOS_TOKEN, build_tiny_model

    build_tiny_model(bis.corpus(), out / "tok", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=16, max_position_embeddings=seq_len)  # fmt: skip
    tok = AutoTokenizer.from_pretrained(out / "tok")
    cfg = qwen2_config(arch, max_positions=max(seq_len, arch.positions),
                       bos_token_id=int(tok.convert_tokens_to_ids(BOS_TOKEN)), eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it trains: seconds on a GPU for 1.5B
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    model.to(torch.bfloat16).save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return out / "model"


def _peak_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _exp_config(args: argparse.Namespace, checkpointing: bool) -> Any:
    from areal_agents.config import ActorConfig, ExperimentConfig, TrainerConfig

    cfg = ExperimentConfig(actor=ActorConfig(lr=1e-5, dtype="bfloat16", grad_reduce_dtype="float32",
                                             gradient_checkpointing=checkpointing, max_tokens_per_mb=args.seq_len),
                           trainer=TrainerConfig(device=args.device, total_steps=args.steps + 1))  # fmt: skip
    cfg.inference.device = args.device
    return cfg


def _episodes(n: int, length: int, vocab: int, seed: int) -> list[Any]:
    """``n`` random-token episodes of ``length``, every token after the first trained."""
    import torch

    from areal_agents.types import Trajectory

    ids = torch.randint(3, vocab, (n, length), generator=torch.Generator().manual_seed(seed)).tolist()
    return [Trajectory(input_ids=row, loss_mask=[0] + [1] * (length - 1), logprobs=[0.0] + [-1.0] * (length - 1),
                       versions=[-1] + [0] * (length - 1), turn_spans=[(1, length)], group_id="sizes")
            for row in ids]  # fmt: skip


def train_run(arch: Arch, model_dir: Path, args: argparse.Namespace, checkpointing: bool) -> tuple[dict[str, Any], Any]:
    """A fresh engine, one warm-up step, ``args.steps`` timed steps; returns (figures, engine)."""
    import torch

    from trainers.engine import TrainEngine
    from trainers.sft import sft_loss

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    engine = TrainEngine(_exp_config(args, checkpointing), model_dir)
    load_s, times, losses = time.perf_counter() - t0, [], []
    for step in range(args.steps + 1):
        batch = engine.to_batch(_episodes(args.batch, args.seq_len, arch.vocab, seed=step))
        sync()
        start = time.perf_counter()
        metrics = engine.train_batch(batch, sft_loss, temperature=1.0, n_minibatches=1)
        sync()
        if step:
            times.append(time.perf_counter() - start)
            losses.append(metrics["loss"])
    tokens_per_s = args.batch * args.seq_len * len(times) / sum(times)
    peak, hw_flops = peak_flops(args.gpu)[0], train_flops_per_token(arch, args.seq_len, recompute=checkpointing)
    return {"tokens_per_s": tokens_per_s, "mfu": mfu(tokens_per_s, train_flops_per_token(arch, args.seq_len), peak),
            "hfu": mfu(tokens_per_s, hw_flops, peak), "peak_mem_mb": _peak_mb(args.device), "step_s": times,
            "tokens_per_step": args.batch * args.seq_len, "loss": losses, "engine_load_s": load_s}, engine  # fmt: skip


def sync_run(engine: Any, addr: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Seconds per full-model sync to the server at ``addr``, disk and gloo broadcast, interleaved."""
    from areal_agents.inference import control
    from trainers.weight_sync import make_weight_sync

    syncs = {}
    for kind in ("disk", "gloo"):
        cfg = copy.deepcopy(engine.cfg)
        cfg.trainer.weight_sync = kind
        syncs[kind] = make_weight_sync(cfg, [addr], tmp / "weights")
    times: dict[str, list[float]] = {"disk": [], "gloo": []}
    version = 0
    for round_ in range(args.repeats + 1):  # round 0 warms up (the gloo group is made there)
        for kind, sync in syncs.items():
            version += 1
            start = time.perf_counter()
            sync.sync(engine, version)
            elapsed = time.perf_counter() - start
            if getattr(sync, "last_error", None):
                raise RuntimeError(f"the gloo broadcast fell back to disk: {sync.last_error}")
            got = control.model_info(addr)["weight_version"]
            if got != str(version):
                raise RuntimeError(f"{kind} sync of version {version}: the server reports version {got}")
            if round_:
                times[kind].append(elapsed)
    syncs["gloo"].close()
    params = sum(p.numel() for p in engine.model.parameters())
    disk, gloo = min(times["disk"]), min(times["gloo"])
    return {"disk_s": disk, "gloo_s": gloo, "disk_over_gloo": disk / gloo, "parameters": params,
            "megabytes_bf16": params * 2 / 2**20, "raw": times}  # fmt: skip


def decode_run(url: str, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The server's decode tokens/s against one batched ``model.generate`` on the same device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok.encode(t) for t in bis.prompts(tok, args.requests)]
    dtype = torch.float32 if args.device == "cpu" else "auto"  # as the embedded server loads it
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
    asyncio.run(bis.server_round(url, ids[:8], 8))  # warm-up
    bis.generate_round(model, tok, ids[:8], 8)
    server, gen = [], []
    for _ in range(args.repeats):
        server.append(asyncio.run(bis.server_round(url, ids, args.new_tokens)))
        gen.append(bis.generate_round(model, tok, ids, args.new_tokens))
    del model
    return {"server_tokens_per_s": max(server), "generate_tokens_per_s": max(gen), "ratio": max(server) / max(gen),
            "requests": args.requests, "new_tokens": args.new_tokens, "raw": {"server": server, "generate": gen}}  # fmt: skip


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


class Runner:
    """Runs the parts of one size within the deadline; a part that fails or finds no time is recorded, not raised."""

    def __init__(self, res: dict[str, Any], deadline: float, min_s: float, save: Any) -> None:
        self.res, self.deadline, self.min_s, self.save = res, deadline, min_s, save
        self.engine: Any = None  # the last trainer engine, kept for the weight sync

    def part(self, name: str, fn: Any) -> Any:
        if self.deadline - time.monotonic() < self.min_s:
            self.res.setdefault("skipped", {})[name] = "out of time"
            return None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - recorded: the other parts still run
            kind = "out_of_memory" if type(exc).__name__ == "OutOfMemoryError" else "errors"  # OOM: a finding
            self.res.setdefault(kind, {})[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return None
        finally:
            self.save()


def run_size(name: str, args: argparse.Namespace, run: Runner, tmp: Path) -> None:
    """Every part of ``args.parts`` for size ``name`` into ``run.res``."""
    arch, res = SIZES[name], run.res
    model_dir = run.part("build", lambda: build_model_dir(arch, tmp, args.device, args.seq_len))
    if model_dir is None:
        return
    for ckpt in (False, True) if "train" in args.parts else ():
        key, run.engine = f"ckpt_{'on' if ckpt else 'off'}", None  # the last engine freed before the next is built
        _free(args.device)
        out = run.part(f"train_{key}", lambda c=ckpt: train_run(arch, model_dir, args, c))
        if out is not None:
            res.setdefault("train", {})[key], run.engine = out
            del out
    if {"sync", "decode"} & set(args.parts):
        run.part("server", lambda: _serve(model_dir, args, run, tmp))  # an error here: the server's start or stop


def _serve(model_dir: Path, args: argparse.Namespace, run: Runner, tmp: Path) -> None:
    """One embedded server of the model: weight sync from the last engine (or a fresh one), then decode."""
    from areal_agents.inference.launcher import launch_servers
    from trainers.engine import TrainEngine

    cfg = _exp_config(args, True)
    cfg.inference.max_batch_size = args.requests
    env = {"OMP_NUM_THREADS": "1"} if args.device == "cpu" else {}
    with launch_servers(cfg, model_dir, 1, log_dir=tmp / "logs", env=env) as group:
        if "sync" in args.parts:
            run.engine = run.engine or run.part("engine", lambda: TrainEngine(cfg, model_dir))
            if run.engine is not None:
                run.res["weight_sync"] = run.part("sync", lambda: sync_run(run.engine, group.addresses[0], args, tmp))
        run.engine = None  # the decode runs without the trainer's memory
        _free(args.device)
        if "decode" in args.parts:
            run.res["decode"] = run.part("decode", lambda: decode_run(group[0].url, model_dir, args))


def summary_line(name: str, res: dict[str, Any]) -> str:
    """One line for the GPU check's summary."""
    parts = [f"{name} ({res['params'] / 1e6:,.1f}M params)"]
    for key, train in res.get("train", {}).items():
        pct = "n/a" if train["mfu"] is None else f"{100 * train['mfu']:.1f}%"
        parts.append(f"{key.replace('_', ' ')}: {train['tokens_per_s']:,.0f} tok/s, MFU {pct}, "
                     f"peak {train['peak_mem_mb'] / 1024:.1f} GiB")  # fmt: skip
    if res.get("weight_sync"):
        ws = res["weight_sync"]
        parts.append(f"sync disk {ws['disk_s']:.2f} s, gloo {ws['gloo_s']:.2f} s")
    if res.get("decode"):
        dec = res["decode"]
        parts.append(f"decode {dec['server_tokens_per_s']:,.0f} tok/s ({dec['ratio']:.2f}x generate)")
    for key in ("skipped", "out_of_memory", "errors"):
        if res.get(key):
            parts.append(f"{key}: " + ", ".join(f"{k} ({v[:80]})" for k, v in res[key].items()))
    return "; ".join(parts)


def _header(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    peak, where = peak_flops(args.gpu)
    return {"benchmark": "sizes", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "device": args.device, "gpu": args.gpu, "peak_bf16_flops": peak, "peak_source": where,
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "seq_len": args.seq_len, "batch": args.batch, "steps": args.steps, "repeats": args.repeats,
            "dtype": "bfloat16 (fp32 master weights, grads reduced in fp32)", "parts": args.parts,
            "flops_per_token": "6*N_mm + 6*L*d_q*(S+1) (train_flops_per_token; HFU adds the recomputed layer forward)",
            "peak_mem": "torch.cuda.max_memory_allocated" if args.device == "cuda" else "process peak RSS so far",
            "target": {**MFU_TARGET, "met": None}, "sizes": {}}  # fmt: skip


def size_header(name: str, seq_len: int) -> dict[str, Any]:
    """What a size's figures start from: its shape, parameters (counted and published), FLOPs per token."""
    arch = SIZES[name]
    return {"config": asdict(arch), "params": param_count(arch), "params_expected": EXPECTED_PARAMS.get(name),
            "matmul_params": matmul_params(arch), "flops_per_token": train_flops_per_token(arch, seq_len),
            "flops_per_token_recompute": train_flops_per_token(arch, seq_len, recompute=True)}  # fmt: skip


def _finish(report: dict[str, Any]) -> None:
    """Summary lines, the MFU target and ``ok`` (no part failed) from the per-size results."""
    sizes = report["sizes"]
    report["lines"] = [summary_line(n, r) for n, r in sizes.items()]
    at = sizes.get(MFU_TARGET["size"], {}).get("train", {})
    best = [t["mfu"] for t in at.values() if t.get("mfu") is not None]
    report["target"]["met"] = max(best) >= MFU_TARGET["mfu_min"] if best else None
    report["ok"] = not any(r.get("errors") for r in sizes.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["1.5b", "0.5b"])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4, help="sequences per optimiser step")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--repeats", type=int, default=1, help="timed rounds of sync and of decode")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--parts", nargs="+", choices=["train", "sync", "decode"], default=["train", "sync", "decode"])
    ap.add_argument("--budget", type=float, default=1e9, help="seconds for all (see --min-part-s)")
    ap.add_argument("--min-part-s", type=float, default=30.0)
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget
    sys.path.insert(0, str(ROOT))  # the checkout under test

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    args.gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    report = _header(args)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        _finish(report)
        out.write_text(json.dumps(report, indent=1) + "\n")

    for name in args.sizes:
        res = report["sizes"][name] = size_header(name, args.seq_len)
        with tempfile.TemporaryDirectory(prefix=f"bench-sizes-{name}-") as tmp:
            run_size(name, args, Runner(res, deadline, args.min_part_s, save), Path(tmp))
        _free(args.device)
    save()
    print("\n".join(report["lines"]))
    print(f"-> {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
