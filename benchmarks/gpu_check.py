"""The GPU check: every CUDA path of the project in one run, with one summary.

Started by ``benchmarks/gpu_check.sh`` (which installs what is missing from a wheelhouse
first); the steps, each a subprocess with its own time limit inside one overall budget:

1. ``device``: torch, CUDA, the GPU and its bfloat16 support.
2. ``rl``: a few steps of the default recipe, ``areal-agents run --env math`` with the
   embedded server and the FSDP2 trainer on the device, ``actor.dtype=bfloat16`` and
   ``actor.grad_reduce_dtype=float32`` (tiny model build and SFT warm start included).
3. ``parity``: the embedded server samples completions with logprobs; the trainer
   recomputes them on the same tokens (bfloat16); the gap between the two.
4. ``bench_trainer`` and ``bench_inference_server`` on the device.
5. ``sizes``: ``bench_sizes`` (Qwen2.5-1.5B- and 0.5B-shaped models with random weights, 4k-token
   sequences: trainer tokens/s, MFU and peak memory with activation checkpointing off and on,
   full-model weight sync by disk and gloo, server decode vs batched ``generate``), one summary
   line per size; with ``--quick`` a 2-layer miniature of the same architecture.

    python benchmarks/gpu_check.py [--device cuda] [--out DIR] [--quick]
    python benchmarks/gpu_check.py deps            # exit 1 (listing them) if requirements are missing
    python benchmarks/gpu_check.py requirements    # the project's requirements but torch, one a line

``--quick`` (the default on ``--device cpu``) shrinks every budget: a dry run of the same
steps. Writes ``DIR/summary.json`` and prints the summary table; exit 1 if a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 540.0  # the whole check stays under 9 minutes on a GPU (the sizes step took it from 450)
CPU_BUDGET_S = 1200.0  # the dry run: a small CPU shared with other work takes longer
STEP_LIMITS_S = {"device": 60.0, "rl": 300.0, "parity": 150.0, "bench_trainer": 150.0, "bench_inference_server": 150.0,
                 "sizes": 270.0}  # fmt: skip
RUN_ARGS = ["inference.device={device}", "trainer.device={device}", "actor.dtype=bfloat16",
            "actor.grad_reduce_dtype=float32", "logging.progress=false", "logging.plots=false",
            "logging.tensorboard=false", "trainer.save_every=0", "trainer.recover=disabled"]  # fmt: skip
FULL_RUN = ["trainer.total_steps=10", "eval.every=0"]
QUICK_RUN = ["trainer.total_steps=2", "eval.every=0", "eval.n=4", "sft.warm_start_steps=4", "sft.batch_size=8",
             "sft.eval_every=0", "rollout.batch_size=2", "rollout.group_size=2"]  # fmt: skip
# Mean |server - trainer| logprob over sampled tokens: both sides compute in bfloat16 on a GPU (the
# trainer through FSDP's bfloat16 parameters); on a CPU the server computes in float32.
PARITY_MEAN_MAX = 0.05


def requirements() -> list[str]:
    """``[project] dependencies`` of pyproject.toml except torch (read without a TOML library)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert block is not None, "pyproject.toml has no [project] dependencies"
    reqs = re.findall(r'^\s*"([^"]+)"', block.group(1), re.M)
    return [r for r in reqs if re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower() != "torch"]


def missing() -> list[str]:
    """Requirements (and the project itself) not installed, or installed at a version that does not fit."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for req in [*requirements(), "areal-agents"]:
        name = re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0]
        try:
            found = version(name)
        except PackageNotFoundError:
            out.append(req)
            continue
        try:
            from packaging.requirements import Requirement

            if not Requirement(req).specifier.contains(found, prereleases=True):
                out.append(f"{req} (found {found})")
        except ImportError:  # packaging itself is missing: it is listed above
            pass
    return out


def _device_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0], "device": device}
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("DEVICE=cuda but torch.cuda.is_available() is False (a CPU build of torch?)")
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                    bf16=torch.cuda.is_bf16_supported())  # fmt: skip
        if not info["bf16"]:
            raise RuntimeError(f"{props.name} has no bfloat16 support")
    return info


def _rl(device: str, out: Path, quick: bool) -> dict[str, Any]:
    args = [a.format(device=device) for a in RUN_ARGS] + (QUICK_RUN if quick else FULL_RUN)
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", *args,
           f"output_dir={out / 'runs'}", "trial_name=gpu-check"]  # fmt: skip
    shutil.rmtree(out / "runs" / "math" / "gpu-check", ignore_errors=True)  # a fresh run each time
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    (out / "rl.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"areal-agents run exited {proc.returncode}: {' | '.join(tail)}")
    run_dir = out / "runs" / "math" / "gpu-check"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "train/loss" in r]
    mean = lambda key: sum(r.get(key, 0.0) for r in steps) / max(1, len(steps))  # noqa: E731
    return {"steps": len(steps), "accuracy_before": evals[0] if evals else None,
            "accuracy_after": evals[-1] if evals else None, "reward_mean": mean("rollout/reward"),
            "gen_tokens_per_s": mean("perf/gen_tokens_per_s"), "train_tokens_per_s": mean("perf/train_tokens_per_s"),
            "wall_s": round(time.monotonic() - start, 1), "final_model": str(run_dir / "final"), "command": cmd}  # fmt: skip


def _parity(device: str, out: Path, quick: bool) -> dict[str, Any]:
    """Server logprobs of sampled completions vs the trainer's recompute on the same tokens."""
    import random

    import httpx
    import torch
    from transformers import AutoTokenizer

    from areal_agents.config import ActorConfig, ExperimentConfig, TrainerConfig
    from areal_agents.inference.launcher import launch_servers
    from areal_agents.types import Trajectory
    from trainers.engine import TrainEngine

    model = out / "runs" / "math" / "gpu-check" / "final"
    if not (model / "config.json").is_file():
        raise RuntimeError(f"no model at {model}: the rl step did not finish")
    tok = AutoTokenizer.from_pretrained(model)
    rng = random.Random(0)
    n, new = (4, 16) if quick else (32, 64)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {rng.randint(0, 99)} + "
                                         f"{rng.randint(0, 99)}?"}], add_generation_prompt=True, tokenize=True)
               for _ in range(n)]  # fmt: skip
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]  # BatchEncoding or list
    cfg = ExperimentConfig()
    cfg.inference.device = device
    with launch_servers(cfg, model, 1, log_dir=out / "parity-logs") as group:
        body = {"input_ids": prompts, "return_logprob": True,
                "sampling_params": {"max_new_tokens": new, "temperature": 1.0, "ignore_eos": True}}  # fmt: skip
        resp = httpx.post(group[0].url + "/generate", json=body, timeout=120)
        if resp.status_code != 200:
            raise RuntimeError(f"/generate answered {resp.status_code}: {resp.text[:300]}")
        replies = resp.json()
    trajs, server = [], []
    for p, r in zip(prompts, replies, strict=True):
        ids, lps = r["output_ids"], [row[0] for row in r["meta_info"]["output_token_logprobs"]]
        trajs.append(Trajectory(input_ids=p + ids, loss_mask=[0] * len(p) + [1] * len(ids),
                                logprobs=[0.0] * len(p) + lps, versions=[-1] * len(p) + [0] * len(ids),
                                turn_spans=[(len(p), len(p) + len(ids))], group_id="parity"))  # fmt: skip
        server.append(lps)
    engine = TrainEngine(ExperimentConfig(actor=ActorConfig(dtype="bfloat16", grad_reduce_dtype="float32"),
                                          trainer=TrainerConfig(device=device)), model)  # fmt: skip
    got = engine.compute_logprobs(trajs, temperature=1.0)
    gaps = torch.cat([(got[i, len(p) : len(p) + len(s)] - torch.tensor(s)).abs()
                      for i, (p, s) in enumerate(zip(prompts, server, strict=True))])  # fmt: skip
    result = {"sequences": n, "tokens": int(gaps.numel()), "mean_abs_diff": float(gaps.mean()),
              "max_abs_diff": float(gaps.max()), "server_dtype": "float32" if device == "cpu" else "bfloat16",
              "trainer_dtype": "bfloat16", "threshold_mean": PARITY_MEAN_MAX}  # fmt: skip
    if not result["mean_abs_diff"] < PARITY_MEAN_MAX:
        raise RuntimeError(f"mean |server - trainer| logprob {result['mean_abs_diff']:.4f} >= {PARITY_MEAN_MAX}")
    return result


def _bench(name: str, device: str, out: Path, quick: bool, limit: float | None = None) -> dict[str, Any]:
    small = {"bench_trainer": ["--steps", "1", "--batch", "8"],
             "bench_inference_server": ["--requests", "8", "--new-tokens", "8", "--repeats", "1"],
             "sizes": ["--sizes", "mini", "--seq-len", "256", "--batch", "2", "--steps", "1", "--requests", "8",
                       "--new-tokens", "8", "--min-part-s", "5"]}  # fmt: skip
    script = "bench_sizes" if name == "sizes" else name
    budget = ["--budget", str(max(30.0, limit - 20))] if name == "sizes" and limit else []  # then it skips parts
    cmd = [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--device", device,
           "--output", str(out / f"{name}.json"), *budget, *(small[name] if quick else [])]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    data = json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").is_file() else {}
    if proc.returncode != 0:
        why = " | ".join(data.get("lines", [])) or (proc.stderr or proc.stdout).strip()
        raise RuntimeError(f"{name} exited {proc.returncode}: {why[-300:]}")
    if name == "sizes":  # a line per size in the summary
        return {"mfu_target_met": data["target"]["met"], "lines": data["lines"]}
    keys = {"bench_trainer": ("engine_tokens_per_s", "plain_padded_tokens_per_s", "speedup_train_only_vs_plain",
                              "engine_peak_mem_mb"),
            "bench_inference_server": ("server_tokens_per_s", "generate_tokens_per_s", "ratio")}  # fmt: skip
    return {k: data[k] for k in keys[name]}


def _step(name: str, args: argparse.Namespace) -> None:
    """Run one step in this process; print its result as one JSON line."""
    out = Path(args.out)
    if name == "device":
        res = _device_info(args.device)
    elif name == "rl":
        res = _rl(args.device, out, args.quick)
    elif name == "parity":
        res = _parity(args.device, out, args.quick)
    else:
        res = _bench(name, args.device, out, args.quick, args.limit)
    print("RESULT " + json.dumps(res))


def run_all(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    summary: dict[str, Any] = {"device": args.device, "quick": args.quick, "budget_s": args.budget, "steps": {}}
    for name in STEP_LIMITS_S:
        left = deadline - time.monotonic()
        if left < 5:
            summary["steps"][name] = {"status": "skipped", "why": "out of time"}
            continue
        limit = min(left, STEP_LIMITS_S[name] * args.budget / BUDGET_S)
        cmd = [sys.executable, __file__, "--device", args.device, "--out", str(out), "--step", name,
               "--limit", f"{limit:.0f}", *(["--quick"] if args.quick else [])]  # fmt: skip
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode == 0 and line:
                entry = {"status": "ok", **json.loads(line[len("RESULT ") :])}
            else:
                why = (proc.stderr or proc.stdout).strip().splitlines()
                entry = {"status": "FAILED", "why": why[-1][-400:] if why else f"exit {proc.returncode}"}
        except subprocess.TimeoutExpired:
            entry = {"status": "FAILED", "why": f"timed out after {limit:.0f} s"}
        entry["seconds"] = round(time.monotonic() - start, 1)
        summary["steps"][name] = entry
        if name == "device" and entry["status"] != "ok":
            break  # nothing else can run
    summary["total_s"] = round(args.budget - (deadline - time.monotonic()), 1)
    summary["ok"] = all(s["status"] == "ok" for s in summary["steps"].values()) and len(summary["steps"]) == len(
        STEP_LIMITS_S
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(format_summary(summary))
    return 0 if summary["ok"] else 1


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"GPU check on {summary['device']}{' (quick dry run)' if summary['quick'] else ''}: "
             f"{'all steps ok' if summary['ok'] else 'FAILED'} in {summary['total_s']:.0f} s"]  # fmt: skip
    for name, s in summary["steps"].items():
        details = {k: v for k, v in s.items() if k not in ("status", "seconds", "command", "final_model", "lines")}
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in details.items())
        lines.append(f"  {name:<24} {s['status']:<8} {s.get('seconds', 0):>6.1f} s  {shown}")
        lines += [f"    {line}" for line in s.get("lines", [])]
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", choices=["run", "deps", "requirements"], default="run")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=os.environ.get("DEVICE", "cuda"))
    ap.add_argument("--out", help="results dir (default benchmarks/results/gpu_check_DEVICE)")
    ap.add_argument("--quick", action="store_true", help="tiny budgets (the default on --device cpu)")
    ap.add_argument("--budget", type=float, help=f"seconds for all steps together (default {BUDGET_S:.0f} on cuda, "
                    f"{CPU_BUDGET_S:.0f} on cpu); each step's limit scales with it")  # fmt: skip
    ap.add_argument("--step", choices=list(STEP_LIMITS_S), help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=float, help=argparse.SUPPRESS)  # the step's seconds (the sizes step fits in them)
    args = ap.parse_args(argv)
    args.quick = args.quick or args.device == "cpu"
    args.out = args.out or str(ROOT / "benchmarks" / "results" / f"gpu_check_{args.device}")
    args.budget = args.budget or (CPU_BUDGET_S if args.device == "cpu" else BUDGET_S)
    if args.command == "requirements":
        print("\n".join(requirements()))
        return 0
    if args.command == "deps":
        gone = missing()
        if gone:
            print("missing: " + ", ".join(gone))
        return 1 if gone else 0
    if args.step:
        sys.path.insert(0, str(ROOT))  # the checkout under test
        _step(args.step, args)
        return 0
    return run_all(args)


if __name__ == "__main__":
    raise SystemExit(main())
