"""Multi-turn credit side by side: GRPO on episode returns, GRPO on per-turn returns, and GiGPO.

Three arms, each the real command (``areal-agents run --env <env>``, as a subprocess) from one
shared warm-start model, with the same config, seeds and budget; they differ only in:

* ``grpo``  — ``algorithm.name=grpo algorithm.credit=trajectory`` (every token gets the episode return);
* ``turn``  — ``algorithm.name=grpo algorithm.credit=turn`` (each turn its discounted return G_t);
* ``gigpo`` — ``algorithm.name=gigpo`` (GRPO's episode advantage plus each turn's G_t normalised
  among the group's turns from the same env state).

Seeds are interleaved (seed 1: every arm, then seed 2, ...; the arm order rotates with the
seed, so no arm always runs first on a cold machine). Every run gets the same budget: training
seconds (``--budget``; evals and start-up excluded, as in ``bench_learning.py``) and at most
``--steps`` steps. Reported per arm over seeds (mean, min-max): training time and steps to first
reach each success level (greedy success through the env, ``eval/accuracy``), and the final
greedy success. Writes ``benchmarks/results/credit.json`` and ``credit.png``.

    python benchmarks/bench_credit.py [--env math-multiturn] [--seeds 1 2 3] [--budget 480]
        [--steps 1000000] [--eval-every 20] [--levels 0.7 0.8 0.9] [--override K=V ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
ROOT = HERE.parent
RESULTS = HERE / "results"
ARMS: dict[str, list[str]] = {
    "grpo": ["algorithm.name=grpo", "algorithm.credit=trajectory"],
    "turn": ["algorithm.name=grpo", "algorithm.credit=turn"],
    "gigpo": ["algorithm.name=gigpo"],
}
BASE = ["env.turn_discount=0.5"]  # a retry is worth less than a first-try success: turns have returns of their own
COLORS = {"grpo": "tab:gray", "turn": "tab:blue", "gigpo": "tab:orange"}

__all__ = ["ARMS", "main", "summarise", "time_to", "verdict"]


def _env() -> dict[str, str]:
    """The environment of the runs: this checkout's packages first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _config(env_name: str, overrides: Sequence[str]) -> Any:
    from areal_agents.config.loader import load_config

    return load_config(overrides=[f"env.name={env_name}", *BASE, *overrides])


def warm_model(env_name: str, overrides: Sequence[str]) -> str:
    """The warm-start model every arm starts from (built and cached on first use)."""
    from trainers.sft import ensure_warm_model

    return str(ensure_warm_model(_config(env_name, overrides), progress=False, warm_start=True))


def run_arm(arm: str, model: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One ``areal-agents run`` of ``arm``; its curve from metrics.jsonl."""
    trial = f"{arm}-seed{seed}"
    max_time = args.budget * 1.35 + 30  # the run's clock includes start-up and evals
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", args.env, *BASE, *args.override, *ARMS[arm],
           f"actor.path={model}", f"seed={seed}", f"trainer.total_steps={args.steps}",
           f"trainer.max_time_s={max_time}", f"eval.every={args.eval_every}", "actor.lr_schedule=constant",
           "trainer.save_every=0", "trainer.recover=disabled", "logging.progress=false", "logging.plots=false",
           "logging.tensorboard=false", f"output_dir={workdir}", "experiment_name=credit", f"trial_name={trial}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=workdir, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    run = read_training(read_metrics(workdir / "credit" / trial / "metrics.jsonl"), args.budget)
    steps = int(run.steps[-1]["step"]) if run.steps else 0
    return {"seed": seed, "curve": run.curve, "train_s": run.train_s, "steps": steps, "wall_s": time.monotonic() - t0}


# ------------------------------------------------------------------------------ analysis
def time_to(curve: list[list[float]], level: float) -> tuple[float, int] | None:
    """``(train_s, step)`` of the first eval at or above ``level``, or None."""
    point = first_reach(curve, level)
    return None if point is None else (point[0], int(point[1]))


def summarise(runs: list[dict[str, Any]], levels: Sequence[float]) -> dict[str, Any]:
    """Per arm: time/steps to each level (over the runs that reached it: ``n`` of ``of``), final success."""
    out: dict[str, Any] = {"time_to_s": {}, "steps_to": {}}
    for level in levels:
        hits = [time_to(r["curve"], level) for r in runs]
        out["time_to_s"][f"{level:.2f}"] = spread([h[0] if h else None for h in hits])
        out["steps_to"][f"{level:.2f}"] = spread([h[1] if h else None for h in hits])
    out["final_success"] = spread([r["curve"][-1][2] for r in runs])
    out["steps"] = spread([r["steps"] for r in runs])
    return out


def verdict(summary: dict[str, dict[str, Any]], levels: Sequence[float]) -> dict[str, Any]:
    """Which arm ends highest (and whether its worst seed beats every other arm's best: ``separated``),
    and which reaches each level first on average among the arms whose every seed reached it."""
    finals = {arm: s["final_success"] for arm, s in summary.items()}
    best = max(finals, key=lambda a: finals[a]["mean"] if finals[a]["mean"] is not None else -1.0)
    separated = all(finals[best]["min"] > finals[a]["max"] for a in finals if a != best)
    fastest: dict[str, str | None] = {}
    for level in levels:
        key = f"{level:.2f}"
        full = {a: s["time_to_s"][key]["mean"] for a, s in summary.items()
                if s["time_to_s"][key]["n"] == s["time_to_s"][key]["of"]}
        fastest[key] = min(full, key=lambda a: full[a]) if full else None
    return {"best_final_success": best, "separated": separated, "fastest_to": fastest}


def _fmt(s: dict[str, Any], digits: int = 2, unit: str = "") -> str:
    if s["mean"] is None:
        return f"never (0/{s['of']})"
    reached = "" if s["n"] == s["of"] else f" ({s['n']}/{s['of']})"
    return f"{s['mean']:.{digits}f}{unit} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]{reached}"


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4))
    for arm, runs in result["runs"].items():
        for i, run in enumerate(runs):
            ax.plot([t / 60 for t, _, _ in run["curve"]], [acc for _, _, acc in run["curve"]], color=COLORS.get(arm),
                    alpha=0.8, lw=1.4, marker=".", label=f"{arm} ({' '.join(ARMS[arm])})" if i == 0 else None)
    for level in result["levels"]:
        ax.axhline(level, color="black", lw=0.5, ls=":")
    ax.set_xlabel("training time (min, evals excluded)")
    ax.set_ylabel("greedy success through the env")
    ax.set_title(f"Multi-turn credit on {result['env']}, {len(result['seeds'])} seed(s) per arm")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="math-multiturn", help="a multi-turn env (default math-multiturn)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--budget", type=float, default=480.0, help="training seconds per run (default 8 min)")
    p.add_argument("--steps", type=int, default=1_000_000, help="at most this many steps per run")
    p.add_argument("--eval-every", type=int, default=20, help="steps between greedy evals")
    p.add_argument("--levels", type=float, nargs="+", default=[0.7, 0.8, 0.9], help="success levels to time")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--override", nargs="*", default=[], metavar="K=V", help="config overrides for every run")
    p.add_argument("--out", type=Path, default=RESULTS / "credit.json")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # this checkout's packages, as the runs get them (_env)
    t_start = time.time()
    load_before = list(os.getloadavg())
    model = warm_model(args.env, args.override)
    print(f"warm start: {model}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    with tempfile.TemporaryDirectory(prefix="bench-credit-") as tmp:
        for i, seed in enumerate(args.seeds):
            order = args.arms[i % len(args.arms):] + args.arms[: i % len(args.arms)]
            for arm in order:
                run = run_arm(arm, model, seed, args, Path(tmp))
                runs[arm].append(run)
                print(f"{arm:6s} seed {seed}: success {run['curve'][0][2]:.2f} -> {run['curve'][-1][2]:.2f} in "
                      f"{run['steps']} steps, {run['train_s']:.0f} s of training ({run['wall_s']:.0f} s wall)",
                      flush=True)
    summary = {arm: summarise(rs, args.levels) for arm, rs in runs.items()}
    result: dict[str, Any] = {
        "benchmark": "multi-turn credit: grpo (episode return) vs grpo credit=turn vs gigpo, same warm start and budget",
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)), "platform": platform.platform(),
        "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
        "env": args.env, "seeds": args.seeds, "budget_s": args.budget, "max_steps": args.steps,
        "eval_every": args.eval_every, "levels": args.levels, "overrides": [*BASE, *args.override],
        "arms": {arm: ARMS[arm] for arm in args.arms}, "warm_model": model,
        "summary": summary, "verdict": verdict(summary, args.levels), "runs": runs,
    }
    print(f"\n{'arm':6s} {'final success':>28s}  " + "  ".join(f"{'time to ' + k:>28s}"
                                                             for k in summary[args.arms[0]]["time_to_s"]))
    for arm, s in summary.items():
        print(f"{arm:6s} {_fmt(s['final_success']):>28s}  "
              + "  ".join(f"{_fmt(t, 0, ' s'):>28s}" for t in s["time_to_s"].values()))
    v = result["verdict"]
    print(f"best final success: {v['best_final_success']} ({'separated from' if v['separated'] else 'overlaps'} "
          f"the other arms over seeds); first to each level: {v['fastest_to']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
