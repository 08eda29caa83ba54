"""Train-phase cost per trained token: multi-turn envs against single-turn ``math``, side by side.

Each run is the real command (``areal-agents run --env NAME``, a subprocess) for ``--steps`` RL
steps without mid-run evals or checkpoints; the warm starts come from one shared cache, built
before anything is timed. Runs are interleaved (repeat 1: every env, then repeat 2, ...; the
order rotates with the repeat). Per step the trainer logs ``time/train_s`` (the train phase:
batching, forward, backward, optimiser step), ``perf/train_tokens_per_s`` (their product is the
step's row tokens: prompt and completion, env messages included), ``train/n_tokens`` (the trained
tokens) and ``train/computed_tokens`` (the positions the forward passes ran, after prefix packing).
Per run, the cost is the median over steps after the first two; per env, the mean and min-max
over repeats, and the ratio to ``math`` measured in the same invocation. The issue's target:
every multi-turn env at most 1.5x ``math`` per trained token.

Each repeat also times **the trainer alone** on the same kind of batch: the env's episodes,
written once by ``areal-agents run --env NAME mode=rollout``, trained on by ``mode=train`` (no
servers, no rollout beside it) with the threads the run's trainer gets beside one embedded
server. In the run, the next batch is generated on the same cores during the train phase.
Writes ``benchmarks/results/train_cost.json``.

    python benchmarks/bench_train_cost.py [--envs math math-multiturn countdown guess-number] [--repeats 2] [--steps 12]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET_RATIO = 1.5


def _cli(env_name: str, cache: Path, out: Path, args: list[str], threads: int | None = None) -> None:
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(cache), **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", env_name, f"output_dir={out}",
           "logging.progress=false", "logging.plots=false", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{env_name}: run failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")


def _costs(env_name: str, out: Path) -> dict[str, Any]:
    """Medians over a run's steps after the first two, from its ``metrics.jsonl``."""
    metrics = next(out.glob(f"{env_name}/*/metrics.jsonl"))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in rows if "time/train_s" in r and r.get("perf/train_tokens_per_s")]
    timed = steps[2:] or steps
    secs = [r["time/train_s"] for r in timed]
    trained = [r.get("train/n_tokens", 0.0) for r in timed]
    row = [r["time/train_s"] * r["perf/train_tokens_per_s"] for r in timed]
    computed = [r.get("train/computed_tokens", 0.0) for r in timed]

    def ms_per(tokens: list[float]) -> float:
        return 1000 * statistics.median(s / max(n, 1.0) for s, n in zip(secs, tokens, strict=True))

    return {"ms_per_token": ms_per(trained), "ms_per_computed_token": ms_per(computed), "ms_per_row_token": ms_per(row),
            "trained_tokens_per_step": statistics.median(trained), "tokens_per_step": statistics.median(row),
            "computed_tokens_per_step": statistics.median(computed), "train_s_per_step": statistics.median(secs),
            "steps": len(steps)}


def run_once(env_name: str, steps: int, cache: Path, out: Path) -> dict[str, Any]:
    """One short run; per-step train seconds and tokens."""
    _cli(env_name, cache, out, [f"trainer.total_steps={steps}", "eval.every=0", "trainer.save_every=0"])
    return _costs(env_name, out)


def alone_once(env_name: str, steps: int, cache: Path, data: Path, out: Path, threads: int) -> dict[str, Any]:
    """The trainer alone (``mode=train``) on the env's written episodes."""
    _cli(env_name, cache, out, ["mode=train", f"train_data={data}", f"trainer.total_steps={steps}"], threads)
    return _costs(env_name, out)


def _line(label: str, r: dict[str, Any]) -> str:
    return (f"{label:<26} {r['ms_per_token']:.3f} ms/trained token  {r['ms_per_computed_token']:.3f} ms/computed  "
            f"{r['trained_tokens_per_step']:.0f} trained / {r['computed_tokens_per_step']:.0f} computed / "
            f"{r['tokens_per_step']:.0f} row tokens a step  {r['train_s_per_step']:.2f} s/step")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=["math", "math-multiturn", "countdown", "guess-number"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", type=Path, default=RESULTS / "train_cost.json")
    args = p.parse_args(argv)
    envs = list(dict.fromkeys(["math", *args.envs]))
    from areal_agents.runtime.cpus import trainer_threads

    threads = trainer_threads(1)  # the run's trainer beside its one embedded CPU server
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in envs}
    alone: dict[str, list[dict[str, Any]]] = {e: [] for e in envs}
    with tempfile.TemporaryDirectory(prefix="bench-train-cost-") as tmp:
        cache, data = Path(tmp) / "cache", {e: Path(tmp) / f"{e}.jsonl" for e in envs}
        for e in envs:  # every warm start first (one step each), so no timed run pays for one; then episodes
            run_once(e, 1, cache, Path(tmp) / f"warm-{e}")
            _cli(e, cache, Path(tmp) / f"rollout-{e}", ["mode=rollout", "rollout.num_episodes=512",
                                                         f"rollout.output_path={data[e]}"])
        for rep in range(args.repeats):
            order = envs[rep % len(envs):] + envs[:rep % len(envs)]
            for e in order:
                runs[e].append(run_once(e, args.steps, cache, Path(tmp) / f"r{rep}-{e}"))
                print(_line(f"repeat {rep + 1} {e}", runs[e][-1]), flush=True)
                alone[e].append(alone_once(e, args.steps, cache, data[e], Path(tmp) / f"a{rep}-{e}", threads))
                print(_line(f"repeat {rep + 1} {e} (alone)", alone[e][-1]), flush=True)
    keys = ("ms_per_token", "ms_per_computed_token", "ms_per_row_token")
    summary: dict[str, Any] = {}
    for where, table in (("run", runs), ("alone", alone)):
        base = {k: statistics.fmean(r[k] for r in table["math"]) for k in keys}
        for e, rs in table.items():
            entry = summary.setdefault(e, {})[where] = {
                k: round(statistics.fmean(r[k] for r in rs)) for k in
                ("tokens_per_step", "trained_tokens_per_step", "computed_tokens_per_step")}
            for k in keys:
                xs = [r[k] for r in rs]
                entry[k] = {"mean": round(statistics.fmean(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
                            "ratio_to_math": round(statistics.fmean(xs) / base[k], 3)}
            t, c = entry["ms_per_token"], entry["ms_per_computed_token"]
            print(f"{e:<15} {where:<5} {t['mean']:.3f} ms/trained token ({t['min']:.3f}-{t['max']:.3f}), "
                  f"{t['ratio_to_math']:.2f}x math (target <= {TARGET_RATIO}x); {c['mean']:.3f} ms/computed token, "
                  f"{c['ratio_to_math']:.2f}x math; {entry['computed_tokens_per_step'] / max(1, entry['trained_tokens_per_step']):.2f} "
                  "computed tokens per trained token")
    result = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "steps": args.steps, "repeats": args.repeats, "target_ratio": TARGET_RATIO, "trainer_threads_alone": threads,
              "summary": summary, "runs": runs, "alone": alone}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
