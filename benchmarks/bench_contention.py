"""A fair share on a busy machine: the same SFT and RL commands alone and beside one busy process per core.

Each workload is the real command as a user runs it (a subprocess, timed whole, start-up included):

- ``sft``: ``areal-agents sft --env math`` for ``--sft-steps`` steps (no evals), from the tiny base model;
- ``rl``: ``areal-agents run --env math`` (its default command: embedded server, RL steps, evals),
  from the cached warm start.

"Busy" starts one spinning process (``while True: pass``) per core this process may use before
the command and stops them after it; "alone" runs it with nothing else. Both caches (tiny model,
warm start) are built once before anything is timed. Repeats are interleaved (alone, busy, busy,
alone, ...) so a drift in the machine's speed falls on both. The figure per workload is
median(busy) / median(alone); with one busy process per core the command's threads get half the
machine, so a fair share is 2x and the target is <= 2.2x. ``--variant NAME:KEY=VAL,...`` times
the commands again with extra environment variables (e.g. ``passive:OMP_WAIT_POLICY=PASSIVE``),
side by side in the same run. Writes ``benchmarks/results/contention.json``.

    python benchmarks/bench_contention.py [--repeats 3] [--sft-steps 60] [--workloads sft rl] [--variant ...]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from areal_agents.runtime.cpus import usable_cpus

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET_RATIO = 2.2
SPIN = "while True: pass"
QUIET = ["logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]


@contextlib.contextmanager
def busy(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` processes that spin on a core each until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def command(workload: str, out: Path, sft_steps: int, rl_args: list[str]) -> list[str]:
    """The user's command for ``workload`` writing under ``out``."""
    cli = [sys.executable, "-m", "areal_agents.cli"]
    if workload == "sft":
        return [*cli, "sft", "--env", "math", f"sft.steps={sft_steps}", "sft.eval_every=0", f"sft.output_dir={out}",
                *QUIET]
    if workload == "rl":
        return [*cli, "run", "--env", "math", f"output_dir={out}", *QUIET, *rl_args]
    raise ValueError(f"unknown workload {workload!r}: sft or rl")


def timed(cmd: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run of ``cmd``; a failed run ends the benchmark with its last line."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise SystemExit(f"{' '.join(cmd[3:6])}: exit {proc.returncode}: {tail}")
    return wall


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "max": round(max(xs), 2), "n": len(xs)}


def summarise(times: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Per ``variant/workload``: alone and busy spreads and median(busy) / median(alone)."""
    out: dict[str, Any] = {}
    for key, t in times.items():
        ratio = statistics.median(t["busy"]) / statistics.median(t["alone"])
        out[key] = {"alone_s": spread(t["alone"]), "busy_s": spread(t["busy"]), "ratio": round(ratio, 2),
                    "meets_target": ratio <= TARGET_RATIO}
    return out


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VAL,KEY=VAL`` (``NAME:`` alone: no extra variables)."""
    name, _, rest = text.partition(":")
    pairs = [p.split("=", 1) for p in rest.split(",") if p]
    if not name or any(len(p) != 2 for p in pairs):
        raise SystemExit(f"--variant {text!r}: write NAME:KEY=VAL[,KEY=VAL...]")
    return name, dict(pairs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--workloads", nargs="+", default=["sft", "rl"], choices=["sft", "rl"])
    p.add_argument("--rl-args", nargs="*", default=[], help="extra overrides of the RL command (tests shrink it)")
    p.add_argument("--variant", action="append", default=[], help="NAME:KEY=VAL,... (repeatable)")
    p.add_argument("--busy", type=int, default=usable_cpus(), help="spinning processes (default: one per core)")
    p.add_argument("--out", type=Path, default=RESULTS / "contention.json")
    args = p.parse_args(argv)
    variants = [("default", {}), *(parse_variant(v) for v in args.variant)]
    times: dict[str, dict[str, list[float]]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as tmp:
        base = {**os.environ, "AREAL_AGENTS_CACHE": str(Path(tmp) / "cache")}
        for w in args.workloads:  # the caches first: nothing timed builds a model or a warm start
            timed(command(w, Path(tmp) / f"warm-{w}", 1, [*args.rl_args, "trainer.total_steps=1", "eval.every=0"]), base)
        for rep in range(args.repeats):
            order = ("alone", "busy") if rep % 2 == 0 else ("busy", "alone")
            for name, extra in variants:
                for w in args.workloads:
                    for cond in order:
                        out = Path(tmp) / f"{name}-{w}-{cond}-{rep}"
                        cmd = command(w, out, args.sft_steps, args.rl_args)
                        with busy(args.busy if cond == "busy" else 0):
                            wall = timed(cmd, {**base, **extra})
                        times.setdefault(f"{name}/{w}", {"alone": [], "busy": []})[cond].append(wall)
                        print(f"repeat {rep + 1} {name:<10} {w:<4} {cond:<5} {wall:7.1f} s", flush=True)
    summary = summarise(times)
    for key, s in summary.items():
        print(f"{key:<16} alone {s['alone_s']['median']:.1f} s ({s['alone_s']['min']:.1f}-{s['alone_s']['max']:.1f}), "
              f"busy {s['busy_s']['median']:.1f} s ({s['busy_s']['min']:.1f}-{s['busy_s']['max']:.1f}): "
              f"{s['ratio']:.2f}x (fair share 2x, target <= {TARGET_RATIO}x)")
    result = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{platform.machine()}, {usable_cpus()} usable cores of {os.cpu_count()}",
              "loadavg_before": [round(x, 2) for x in load_before], "busy_processes": args.busy,
              "repeats": args.repeats, "sft_steps": args.sft_steps, "target_ratio": TARGET_RATIO,
              "variants": {n: e for n, e in variants}, "summary": summary, "times": times}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
