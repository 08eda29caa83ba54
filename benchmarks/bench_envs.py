"""Every built-in env's default command, as a new user runs it: ``areal-agents run --env NAME seed=S``
from an empty cache (warm start included), one subprocess per run, one at a time.

Per run it records the whole command's wall time, the warm start (SFT steps, seconds, what its
check measured and where it stopped), greedy success on the held-out split before RL (step 0)
and after (the last eval), the evals in between, and whether the bar of the agents issue is met:
a gain of at least 20 points or an end of at least 0.80, within 10 minutes for the whole command.
Per env: mean and min-max over seeds. Writes ``benchmarks/results/envs.json`` (merged into what is
there, so envs can be measured in separate invocations) and prints a table.

    python benchmarks/bench_envs.py [--envs guess-number python-tool] [--seeds 1 2 3] [--override K=V ...]
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
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ENVS = ("math", "math-multiturn", "countdown", "guess-number", "python-tool", "unit-convert")
BAR_GAIN, BAR_END, BAR_SECONDS = 0.20, 0.80, 600.0


def run_once(env_name: str, seed: int, overrides: list[str], workdir: Path) -> dict[str, Any]:
    """One default command from an empty cache under ``workdir``; its figures."""
    env = {**os.environ, "AREAL_AGENTS_CACHE": str(workdir / "cache")}
    cmd = [sys.executable, "-m", "areal_agents.cli", "run", "--env", env_name, f"seed={seed}",
           f"output_dir={workdir / 'runs'}", "logging.progress=false", *overrides]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        return {"env": env_name, "seed": seed, "ok": False, "seconds": round(seconds, 1),
                "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    report_path = next((workdir / "cache" / "warm").glob(f"{env_name}-*/sft_report.json"), None)
    report = json.loads(report_path.read_text()) if report_path else {}
    metrics = next((workdir / "runs").glob(f"{env_name}/*/metrics.jsonl"))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    evals = [(int(r.get("step", 0)), float(r["eval/accuracy"])) for r in rows if "eval/accuracy" in r]
    before, after = evals[0][1], evals[-1][1]
    met = (after - before >= BAR_GAIN or after >= BAR_END) and seconds <= BAR_SECONDS
    return {
        "env": env_name, "seed": seed, "ok": True, "seconds": round(seconds, 1),
        "warm_start": {k: report.get(k) for k in ("steps", "seconds", "check", "reached")}
        | {"stopped_at": (report.get("evals") or [{}])[-1].get("acc")} if report else None,
        "before": before, "after": after, "gain": round(after - before, 3), "evals": evals,
        "rl_steps": sum(1 for r in rows if "train/loss" in r), "met": met,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return {"runs": len(runs), "failed": len(runs)}

    def spread(key: str) -> dict[str, float]:
        xs = [float(r[key]) for r in ok]
        return {"mean": round(statistics.fmean(xs), 3), "min": min(xs), "max": max(xs)}

    return {"runs": len(runs), "failed": len(runs) - len(ok), "met": sum(r["met"] for r in ok),
            "gain": spread("gain"), "after": spread("after"), "seconds": spread("seconds")}


def _row(r: dict[str, Any]) -> str:
    if not r["ok"]:
        return f"{r['env']:<15} {r['seed']:>4}  FAILED after {r['seconds']:.0f} s: {r['error']}"
    ws = r["warm_start"] or {}
    return (f"{r['env']:<15} {r['seed']:>4}  warm {ws.get('steps')} steps {ws.get('seconds')} s  "
            f"{r['before']:.3f} -> {r['after']:.3f} ({100 * r['gain']:+.1f})  {r['seconds'] / 60:.1f} min  "
            f"{'met' if r['met'] else 'not met'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=list(ENVS))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--override", nargs="*", default=[], metavar="K=V", help="extra config overrides for every run")
    p.add_argument("--out", type=Path, default=RESULTS / "envs.json")
    args = p.parse_args(argv)
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {"envs": {}}
    for env_name in args.envs:
        runs = []
        for seed in args.seeds:
            with tempfile.TemporaryDirectory(prefix=f"bench-envs-{env_name}-") as tmp:
                run = run_once(env_name, seed, list(args.override), Path(tmp))
            print(_row(run), flush=True)
            runs.append(run)
        result["envs"][env_name] = {
            "date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "overrides": list(args.override), "runs": runs, "summary": summarise(runs)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        s = result["envs"][env_name]["summary"]
        print(f"{env_name}: bar met in {s.get('met', 0)} of {s['runs']} seeds; {s}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
