"""Train-phase cost per trained token: multi-turn envs against single-turn ``math``, side by side.

Each run is the real command (``areal-agents run --env NAME``, a subprocess) for ``--steps`` RL
steps without mid-run evals or checkpoints; the warm starts come from one shared cache, built
before anything is timed. Runs are interleaved (repeat 1: every env, then repeat 2, ...; the
order rotates with the repeat). Per step the trainer logs ``time/train_s`` (the train phase:
batching, forward, backward, optimiser step) and ``perf/train_tokens_per_s``; their product is
the step's trained tokens (prompt and completion, env messages included). Per run, the cost is
the median over steps after the first two of train seconds / trained tokens; per env, the mean
and min-max over repeats, and the ratio to ``math`` measured in the same invocation. The issue's
target: every multi-turn env at most 1.5x ``math``. Writes ``benchmarks/results/train_cost.json``.

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


def run_once(env_name: str, steps: int, cache: Path, out: Path) -> dict[str, Any]:
    """One short run; per-step train seconds and trained tokens."""
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", env_name, f"output_dir={out}",
           f"trainer.total_steps={steps}", "eval.every=0", "trainer.save_every=0", "logging.progress=false",
           "logging.plots=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{env_name}: run failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    metrics = next(out.glob(f"{env_name}/*/metrics.jsonl"))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps_rows = [r for r in rows if "time/train_s" in r and r.get("perf/train_tokens_per_s")]
    per_step = [(r["time/train_s"], r["time/train_s"] * r["perf/train_tokens_per_s"], r.get("train/n_tokens", 0.0))
                for r in steps_rows]
    timed = per_step[2:] or per_step
    return {"ms_per_token": 1000 * statistics.median(s / max(n, 1.0) for s, _, n in timed),
            "ms_per_row_token": 1000 * statistics.median(s / max(t, 1.0) for s, t, _ in timed),
            "trained_tokens_per_step": statistics.median(n for _, _, n in timed),
            "tokens_per_step": statistics.median(t for _, t, _ in timed),
            "train_s_per_step": statistics.median(s for s, _, _ in timed), "steps": len(per_step)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=["math", "math-multiturn", "countdown", "guess-number"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", type=Path, default=RESULTS / "train_cost.json")
    args = p.parse_args(argv)
    envs = list(dict.fromkeys(["math", *args.envs]))
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in envs}
    with tempfile.TemporaryDirectory(prefix="bench-train-cost-") as tmp:
        cache = Path(tmp) / "cache"
        for e in envs:  # build every warm start first (one step each), so no timed run pays for one
            run_once(e, 1, cache, Path(tmp) / f"warm-{e}")
        for rep in range(args.repeats):
            order = envs[rep % len(envs):] + envs[:rep % len(envs)]
            for e in order:
                r = run_once(e, args.steps, cache, Path(tmp) / f"r{rep}-{e}")
                runs[e].append(r)
                print(f"repeat {rep + 1} {e:<15} {r['ms_per_token']:.3f} ms/trained token  "
                      f"{r['ms_per_row_token']:.3f} ms/row token  {r['trained_tokens_per_step']:.0f} trained of "
                      f"{r['tokens_per_step']:.0f} tokens/step  {r['train_s_per_step']:.2f} s/step", flush=True)
    summary: dict[str, Any] = {}
    base = {k: statistics.fmean(r[k] for r in runs["math"]) for k in ("ms_per_token", "ms_per_row_token")}
    for e, rs in runs.items():
        summary[e] = {"tokens_per_step": round(statistics.fmean(r["tokens_per_step"] for r in rs)),
                      "trained_tokens_per_step": round(statistics.fmean(r["trained_tokens_per_step"] for r in rs))}
        for k in ("ms_per_token", "ms_per_row_token"):
            xs = [r[k] for r in rs]
            summary[e][k] = {"mean": round(statistics.fmean(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
                             "ratio_to_math": round(statistics.fmean(xs) / base[k], 3)}
        t, rt = summary[e]["ms_per_token"], summary[e]["ms_per_row_token"]
        print(f"{e:<15} {t['mean']:.3f} ms/trained token ({t['min']:.3f}-{t['max']:.3f}), {t['ratio_to_math']:.2f}x math "
              f"(target <= {TARGET_RATIO}x); {rt['mean']:.3f} ms/row token, {rt['ratio_to_math']:.2f}x math")
    result = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "steps": args.steps, "repeats": args.repeats, "target_ratio": TARGET_RATIO, "summary": summary,
              "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
