"""Learning speed: ``areal-agents run --env math`` against a plain synchronous PyTorch GRPO loop.

Both start from the same warm-start model (the default run's, built once), train on the same
prompts with the same reward, batch (16 prompts × 8 samples), sampling (temperature, top-p,
max new tokens) and optimiser (AdamW, learning rate and its warmup, betas, gradient clip; a
constant rate after the warmup, since a time budget fixes no step count), each on every core of the machine, each for the same
budget of training time, and are evaluated with greedy decoding on the same held-out rows.

The plain loop is the "no framework" baseline anyone could write: HF ``generate`` with
sampling, group-normalised advantages, token-mean policy-gradient loss, one AdamW step per
batch, all in one process, generation and training taking turns. areal-agents is the real
command (``areal-agents run``, embedded server, async rollout), run as a subprocess.

Training time excludes evaluation and start-up on both sides: it is the wall time since the
first step began minus the time the loop stood still for evals (areal-agents runs an eval between
steps beside the next step, which then waits for it only if it is not done: that wait is what counts). Reported per system, over seeds: samples/s
(trained; generated, which for areal-agents adds the groups its group filter set aside; and
with a learning signal: samples in groups whose rewards are not all equal, the only ones
whose group-normalised advantage is not zero, so the only ones that move the policy),
greedy accuracy at 1/2/4/8 minutes, time to first reach 0.80/0.90/0.95 and whether the
final eval still holds it; mean, min and max. Writes ``benchmarks/results/learning.json``
and ``learning.png`` (accuracy vs training time).

Besides, per seed, the default command from the same warm start (``areal-agents run --env math
actor.path=...``: 200 steps, an eval every 50) is timed whole, to give the share of its wall time
that its evals hold the loop at the default eval interval (and, beside it, the evals' own time).

The targets: in the default command's 200 steps areal-agents trains at least as many samples a
second as the plain loop generates and trains (over the whole budget it trains fewer: once the
model solves nearly every sum, its group filter sets most groups aside); its first greedy
accuracy of 0.95 comes in at most 0.35x the plain loop's time (a plain run that never reaches
0.95 counts with the whole budget: a bound in the plain loop's favour); its final accuracy is at
least the plain loop's; evals take at most 5 % of the default command's wall time.

    python benchmarks/bench_learning.py [--seeds 1 2 3] [--budget 480] [--eval-every 20]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from curves import first_reach, read_metrics, read_training, spread  # noqa: E402 - the sibling module both learning benchmarks read runs with

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MARKS_MIN = (1, 2, 4, 8)
THRESHOLDS = (0.80, 0.90, 0.95)
TARGETS = {"samples_per_s_ratio": 1.0, "time_to_0.95_ratio": 0.35, "final_accuracy_gap": 0.0, "eval_share": 0.05}
COUNTS = ("samples", "generated", "signal")  # trained, generated, with a learning signal (per run)


def _config(seed: int) -> Any:
    from areal_agents.config.loader import load_config

    return load_config(overrides=["env.name=math", f"seed={seed}"])


def _warm_model() -> str:
    """The default run's warm-start model (built and cached on first use)."""
    from trainers.sft import ensure_warm_model

    return str(ensure_warm_model(_config(1), progress=False, warm_start=True))


# ------------------------------------------------------------------------------ plain loop
def plain_loop(model_path: str, seed: int, budget_s: float, eval_every: int) -> dict[str, Any]:
    """Synchronous GRPO in plain PyTorch; returns ``{"curve": [[train_s, acc], ...], ...}``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_agents.data import load_dataset_rows
    from areal_agents.gym.registration import make_env
    from areal_agents.rewards import math_reward
    from trainers.sft import greedy_accuracy, render_examples

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(seed)
    cfg = _config(seed)
    rng = random.Random(seed)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    env = make_env("math")
    train_rows = load_dataset_rows(cfg, "train")
    test_rows = load_dataset_rows(cfg, "test")[: cfg.eval.n or cfg.data.test_size]
    _, train_prompts = render_examples(cfg, tok, env, train_rows)
    _, test_prompts = render_examples(cfg, tok, env, test_rows)
    a, s = cfg.actor, cfg.sampling
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(a.betas[0], a.betas[1]), weight_decay=a.weight_decay)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(1, a.warmup_steps)))
    pad, eos = tok.pad_token_id, tok.eos_token_id
    n_prompts, group = cfg.rollout.batch_size, cfg.rollout.group_size
    order: list[int] = []

    def evaluate() -> float:
        return greedy_accuracy(model, tok, env, test_rows, test_prompts, max_new_tokens=s.max_new_tokens)

    curve = [[0.0, evaluate()]]
    train_s, steps, samples, signal = 0.0, 0, 0, 0
    phase = {"generate_s": 0.0, "reward_s": 0.0, "train_s": 0.0}
    while train_s < budget_s:
        t0 = time.perf_counter()
        idx = []
        for _ in range(n_prompts):
            if not order:
                order = list(range(len(train_rows)))
                rng.shuffle(order)
            idx.append(order.pop())
        prompts = [train_prompts[i] for i in idx for _ in range(group)]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attn = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
        model.eval()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=s.temperature or 1.0,
                                 top_p=s.top_p, top_k=0 if s.top_k < 0 else s.top_k, max_new_tokens=s.max_new_tokens,
                                 eos_token_id=eos, pad_token_id=pad)
        gen = out[:, width:]
        # a completion ends at its first eos (kept: the model learns to stop); the rest is padding
        done = (gen == eos).long().cumsum(1)
        comp_mask = (done == 0) | ((gen == eos) & (done == 1))
        t1 = time.perf_counter()
        texts = [tok.decode(g[m].tolist(), skip_special_tokens=True) for g, m in zip(gen, comp_mask, strict=True)]
        rows = [train_rows[i] for i in idx for _ in range(group)]
        rewards = torch.tensor([float(math_reward(t, **row)) for t, row in zip(texts, rows, strict=True)])
        r = rewards.view(n_prompts, group)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + 1e-6)).view(-1)
        signal += group * int((r.amax(1) > r.amin(1)).sum())  # an all-equal group has advantage 0
        t2 = time.perf_counter()
        model.train()
        full = torch.cat([ids, gen], 1)
        full_attn = torch.cat([attn, comp_mask.long()], 1)
        logits = model(input_ids=full, attention_mask=full_attn).logits[:, width - 1 : -1].float()
        logp = torch.log_softmax(logits / (s.temperature or 1.0), -1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
        mask = comp_mask.float()
        loss = -(adv[:, None] * logp * mask).sum() / mask.sum().clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
        opt.step()
        warmup.step()
        t3 = time.perf_counter()
        phase["generate_s"] += t1 - t0
        phase["reward_s"] += t2 - t1
        phase["train_s"] += t3 - t2
        train_s += t3 - t0
        steps += 1
        samples += len(prompts)
        if steps % eval_every == 0:
            curve.append([train_s, evaluate()])
    if curve[-1][0] != train_s:
        curve.append([train_s, evaluate()])
    return {"curve": curve, "steps": steps, "samples": samples, "signal": signal, "train_s": train_s,
            "phases_s": phase}


# ------------------------------------------------------------------------------ areal-agents
def areal_run(model_path: str, seed: int, budget_s: float, eval_every: int, workdir: Path,
              overrides: Sequence[str] = ()) -> dict[str, Any]:
    """``areal-agents run --env math`` from ``model_path``; the curve comes from its metrics.jsonl."""
    # the run's clock includes server start-up and evals; leave room so training time reaches the budget
    max_time = budget_s * 1.1 + 30
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", f"actor.path={model_path}",
           f"seed={seed}", "trainer.total_steps=1000000", f"trainer.max_time_s={max_time}",
           "actor.lr_schedule=constant", f"eval.every={eval_every}", "trainer.save_every=0",
           "trainer.recover=disabled", "logging.progress=false", "logging.plots=false",
           "logging.tensorboard=false", f"output_dir={workdir}", f"trial_name=seed{seed}", *overrides]
    subprocess.run(cmd, check=True, cwd=workdir, stdout=subprocess.DEVNULL)
    return read_run(workdir / "math" / f"seed{seed}" / "metrics.jsonl", budget_s, seed)


def read_run(metrics: Path, budget_s: float, seed: int) -> dict[str, Any]:
    """A run's curve and counts from its ``metrics.jsonl``, up to ``budget_s`` of training time
    (:func:`curves.read_training`)."""
    run = read_training(read_metrics(metrics), budget_s)
    samples, signal, dropped = 0, 0.0, 0.0
    phase = {"rollout_wait_s": 0.0, "train_s": 0.0, "sync_s": 0.0}
    for row in run.steps:
        n_seqs = int(row.get("train/n_seqs", 0))
        samples += n_seqs
        signal += n_seqs * row.get("rollout/signal_groups", 1.0)
        dropped = row.get("rollout/dropped_groups", dropped)  # cumulative: groups the filter set aside
        for k in phase:
            phase[k] += row.get(f"time/{k}", 0.0)
    generated = samples + int(dropped) * _config(seed).rollout.group_size
    return {"curve": [[t, acc] for t, _, acc in run.curve], "steps": len(run.steps), "samples": samples,
            "generated": generated, "signal": round(signal), "train_s": run.train_s, "phases_s": phase}


def default_run(model_path: str, seed: int, workdir: Path) -> dict[str, Any]:
    """The default command from ``model_path``, timed whole: the share of its wall time its evals take."""
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", "math", f"actor.path={model_path}",
           f"seed={seed}", "logging.progress=false", f"output_dir={workdir}", f"trial_name=default{seed}"]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, cwd=workdir, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    metrics = workdir / "math" / f"default{seed}" / "metrics.jsonl"
    rows = read_metrics(metrics)
    evals = [row["time/eval_s"] for row in rows if "time/eval_s" in row]  # what the loop waited for
    own = sum(row.get("eval/wall_s", row.get("time/eval_s", 0.0)) for row in rows)  # each eval, start to end
    run = read_run(metrics, math.inf, seed)  # its training time as the budget runs count theirs
    return {"wall_s": wall, "eval_s": sum(evals), "evals": len(evals), "eval_share": sum(evals) / wall,
            "eval_wall_s": own,
            "steps": run["steps"], "samples": run["samples"], "train_s": run["train_s"],
            "samples_per_s": run["samples"] / run["train_s"], "accuracy_before": run["curve"][0][1],
            "accuracy_after": run["curve"][-1][1]}


# ------------------------------------------------------------------------------ analysis
def acc_at(curve: list[list[float]], t: float) -> float:
    """Accuracy of the last eval at or before training time ``t``."""
    return max((c for c in curve if c[0] <= t + 1e-9), key=lambda c: c[0])[1]


def time_to(curve: list[list[float]], thr: float) -> float | None:
    """Training time of the first eval at or above ``thr``, or None."""
    point = first_reach(curve, thr)
    return None if point is None else point[0]


def summarise(runs: list[dict[str, Any]], budget_s: float) -> dict[str, Any]:
    # a run without a count of its own (no filter, or not counted) trained all it generated, each with a signal
    out: dict[str, Any] = {f"{kind}_per_s": spread([r.get(kind, r["samples"]) / r["train_s"] for r in runs])
                           for kind in COUNTS}
    out["accuracy_at_min"] = {str(m): spread([acc_at(r["curve"], m * 60) for r in runs])
                              for m in MARKS_MIN if m * 60 <= budget_s + 1e-9}
    out["time_to_s"] = {}
    for thr in THRESHOLDS:
        times = [time_to(r["curve"], thr) for r in runs]
        held = [t is not None and r["curve"][-1][1] >= thr - 1e-9 for t, r in zip(times, runs, strict=True)]
        out["time_to_s"][f"{thr:.2f}"] = {**spread(times), "held_at_end": sum(held)}
    out["final_accuracy"] = spread([r["curve"][-1][1] for r in runs])
    defaults = [r["default"] for r in runs if "default" in r]
    if defaults:
        out["default_run"] = {k: spread([d.get(k) for d in defaults])
                              for k in ("wall_s", "eval_s", "eval_share", "eval_wall_s", "samples_per_s")}
    return out


def time_ratio(areal: list[dict[str, Any]], plain: list[dict[str, Any]], thr: float, budget_s: float) -> float | None:
    """Mean time to ``thr`` of areal-agents over the plain loop's; None unless every areal run got
    there. A plain run that never did counts with ``budget_s`` (a bound in its favour)."""
    ta = [time_to(r["curve"], thr) for r in areal]
    if not ta or any(t is None for t in ta):
        return None
    tp = [time_to(r["curve"], thr) for r in plain]
    return statistics.fmean(t for t in ta if t is not None) / statistics.fmean(budget_s if t is None else t for t in tp)


def verdict(summary: dict[str, Any], runs: dict[str, list[dict[str, Any]]], budget_s: float) -> dict[str, Any]:
    """The ratios the targets name, and whether each is met."""
    a, p = summary["areal"], summary["plain"]
    ratios = {kind: a[f"{kind}_per_s"]["mean"] / p[f"{kind}_per_s"]["mean"] for kind in COUNTS}
    t95 = time_ratio(runs["areal"], runs["plain"], 0.95, budget_s)
    t90 = time_ratio(runs["areal"], runs["plain"], 0.90, budget_s)
    gap = a["final_accuracy"]["mean"] - p["final_accuracy"]["mean"]
    share = a.get("default_run", {}).get("eval_share", {}).get("mean")
    default_rate = a.get("default_run", {}).get("samples_per_s", {}).get("mean")
    default_ratio = None if default_rate is None else default_rate / p["samples_per_s"]["mean"]
    met = {"default_samples_per_s_ratio": default_ratio is not None
           and default_ratio >= TARGETS["samples_per_s_ratio"],
           "time_to_0.95_ratio": t95 is not None and t95 <= TARGETS["time_to_0.95_ratio"],
           "final_accuracy_gap": gap >= TARGETS["final_accuracy_gap"],
           "eval_share": share is not None and share <= TARGETS["eval_share"]}
    headline = default_ratio if default_ratio is not None else ratios["samples"]  # the trained samples/s target's
    return {"ratio": headline, "samples_per_s_ratio": ratios["samples"],
            "default_samples_per_s_ratio": default_ratio,
            "generated_per_s_ratio": ratios["generated"], "signal_per_s_ratio": ratios["signal"],
            "time_to_090_ratio": t90, "time_to_095_ratio": t95, "final_accuracy_gap": gap, "eval_share": share,
            "met": met, "meets_target": all(met.values())}


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4))
    for name, color in (("areal", "tab:orange"), ("plain", "tab:gray")):
        for i, run in enumerate(result["runs"][name]):
            xs = [t / 60 for t, _ in run["curve"]]
            ax.plot(xs, [acc for _, acc in run["curve"]], color=color, alpha=0.8, lw=1.4,
                    label=("areal-agents run" if name == "areal" else "plain synchronous PyTorch loop") if i == 0 else None)
    for thr in THRESHOLDS:
        ax.axhline(thr, color="black", lw=0.5, ls=":")
    ax.set_xlabel("training time (min, evals excluded)")
    ax.set_ylabel(f"greedy accuracy ({result['eval_rows']} held-out sums)")
    ax.set_title(f"Learning speed, same warm start, {len(result['seeds'])} seeds each, {result['cpus']} CPU cores")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--budget", type=float, default=480.0, help="training seconds per run (default 8 min)")
    p.add_argument("--eval-every", type=int, default=20, help="steps between greedy evals (both systems)")
    p.add_argument("--systems", nargs="+", default=["areal", "plain"], choices=["areal", "plain"])
    p.add_argument("--override", nargs="*", default=[], metavar="K=V",
                   help="extra config overrides for the areal-agents runs (to compare a setting)")
    p.add_argument("--out", type=Path, default=RESULTS / "learning.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one plain-loop run in its own process
    args = p.parse_args(argv)
    if args.worker:
        model, seed = args.worker.split(",")
        print(json.dumps(plain_loop(model, int(seed), args.budget, args.eval_every)))
        return 0

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    model = _warm_model()
    cfg = _config(args.seeds[0])
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.systems}
    t_start = time.time()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    console = bar.console
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as tmp, bar:
        task = bar.add_task("runs", total=len(args.seeds) * len(args.systems))
        for seed in args.seeds:
            for name in args.systems:
                bar.update(task, description=f"{name} seed {seed} ({args.budget:.0f} s of training)")
                t0 = time.monotonic()
                if name == "areal":
                    run = areal_run(model, seed, args.budget, args.eval_every, Path(tmp), args.override)
                    if not args.override:  # the default command, as it is
                        run["default"] = default_run(model, seed, Path(tmp))
                else:
                    proc = subprocess.run([sys.executable, __file__, "--worker", f"{model},{seed}", "--budget",
                                           str(args.budget), "--eval-every", str(args.eval_every)],
                                          check=True, capture_output=True, text=True)
                    run = json.loads(proc.stdout.strip().splitlines()[-1])
                run["seed"] = seed
                runs[name].append(run)
                console.print(f"{name:6s} seed {seed}: {run['samples'] / run['train_s']:.0f} samples/s trained "
                              f"({run.get('generated', run['samples']) / run['train_s']:.0f} generated, "
                              f"{run['signal'] / run['train_s']:.0f} with a learning signal), "
                              f"accuracy {run['curve'][0][1]:.2f} -> {run['curve'][-1][1]:.2f} in "
                              f"{run['train_s']:.0f} s of training ({time.monotonic() - t0:.0f} s wall)")
                bar.advance(task)
    summary = {name: summarise(rs, args.budget) for name, rs in runs.items()}
    result: dict[str, Any] = {
        "benchmark": "greedy accuracy vs training time, areal-agents run vs a plain synchronous GRPO loop",
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)),
        "platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg()),
        "seeds": args.seeds, "budget_s": args.budget, "overrides": args.override, "eval_every": args.eval_every,
        "eval_rows": cfg.eval.n or cfg.data.test_size, "warm_model": model,
        "batch": f"{cfg.rollout.batch_size} x {cfg.rollout.group_size}", "lr": cfg.actor.lr,
        "summary": summary, "runs": runs, "targets": TARGETS,
    }
    if {"areal", "plain"} <= set(runs):
        v = verdict(summary, runs, args.budget)
        result.update(v)

        def num(x: float | None, fmt: str = ".2f") -> str:
            return "n/a" if x is None else f"{x:{fmt}}"

        console.print(f"samples/s trained: {num(v['default_samples_per_s_ratio'])}x in the default command's 200 "
                      f"steps (target >= 1.0), {v['samples_per_s_ratio']:.2f}x over the budget, "
                      f"{v['generated_per_s_ratio']:.2f}x generated, {v['signal_per_s_ratio']:.2f}x with a learning "
                      f"signal; time to 0.95: {num(v['time_to_095_ratio'])}x (target <= 0.35), to 0.90: "
                      f"{num(v['time_to_090_ratio'])}x; final accuracy {v['final_accuracy_gap']:+.3f} (target >= 0); "
                      f"evals hold the loop {num(v['eval_share'] and 100 * v['eval_share'], '.1f')} % of the default "
                      f"command (target <= 5); met: {', '.join(k for k, ok in v['met'].items() if ok) or 'none'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    if {"areal", "plain"} <= set(runs):
        plot(result, args.out.with_suffix(".png"))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
