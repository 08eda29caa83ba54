"""Run every ``benchmarks/bench_*.py`` one after the other, then rebuild the table of docs/benchmarks.md.

    python benchmarks/run_all.py [--only NAME ...] [--skip NAME ...] [--timeout 900] [--no-report]

Each script runs with its default (documented) settings in a subprocess and writes its JSON to
``benchmarks/results/``; ``bench_rollout_async.py`` runs twice (simulated engine and the real
embedded server). ``results/machine.json`` records the machine and the load around the run,
``results/run_all.json`` each script's exit code and duration. Finally ``report.py`` writes
the table between the README's bench markers and the async-vs-sync chart. A failing script
is reported and the others still run; the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["discover", "machine_info", "main"]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# extra invocations besides the default one, by script name
VARIANTS: dict[str, list[list[str]]] = {"bench_rollout_async.py": [[], ["--backend", "embedded"]]}


def discover(only: list[str] | None = None, skip: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """``(script name, args)`` for every invocation to run, in name order.

    ``only``/``skip`` match the script name with or without ``bench_`` and ``.py``.
    """
    def key(name: str) -> str:
        return name.removeprefix("bench_").removesuffix(".py")

    wanted = {key(n) for n in only or []}
    unwanted = {key(n) for n in skip or []}
    runs = []
    for script in sorted(HERE.glob("bench_*.py")):
        if (wanted and key(script.name) not in wanted) or key(script.name) in unwanted:
            continue
        for args in VARIANTS.get(script.name, [[]]):
            runs.append((script.name, args))
    return runs


def machine_info() -> dict[str, object]:
    """What the figures were measured on."""
    try:
        import torch

        torch_version = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        torch_version, gpu = None, None
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch_version, "gpu": gpu,
            "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="run only these benchmarks (e.g. rollout_async)")
    p.add_argument("--skip", nargs="*", help="leave these benchmarks out")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per script")
    p.add_argument("--no-report", action="store_true", help="do not rebuild the docs/benchmarks.md table")
    args = p.parse_args(argv)
    runs = discover(args.only, args.skip)
    if not runs:
        print("error: no benchmark matches --only/--skip", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    machine["loadavg_before"] = list(os.getloadavg())
    summary = []
    for i, (script, extra) in enumerate(runs, 1):
        label = " ".join([script, *extra])
        print(f"[{i}/{len(runs)}] {label}", flush=True)
        t0 = time.monotonic()
        try:
            code = subprocess.call([sys.executable, str(HERE / script), *extra], cwd=HERE.parent, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = 124
        seconds = round(time.monotonic() - t0, 1)
        summary.append({"script": script, "args": extra, "exit_code": code, "seconds": seconds})
        print(f"[{i}/{len(runs)}] {label}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {seconds} s", flush=True)
    machine["loadavg_after"] = list(os.getloadavg())
    (RESULTS / "machine.json").write_text(json.dumps(machine, indent=1) + "\n")
    (RESULTS / "run_all.json").write_text(json.dumps(summary, indent=1) + "\n")
    failed = [s for s in summary if s["exit_code"] != 0]
    if not args.no_report:
        from report import main as report_main  # benchmarks/ is this script's directory

        report_main([])
    if failed:
        print("failed: " + ", ".join(" ".join([s["script"], *s["args"]]) for s in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
