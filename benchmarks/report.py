"""Build the performance table of docs/benchmarks.md and its charts from ``benchmarks/results/*.json``.

    python benchmarks/report.py [--results DIR] [--readme docs/benchmarks.md] [--check]

Reads the JSON each ``bench_*.py`` wrote (nothing is re-measured), writes the table between
``<!-- bench:start -->`` and ``<!-- bench:end -->`` in the README (nothing outside the
markers changes), ``async_vs_sync.png`` and, from ``envs.json``, ``envs.png`` (greedy success by
RL step, every seed of every env's default command) into the results dir. Every ratio compares two
figures measured side by side in the same invocation of one script. The machine line comes
from ``machine.json`` (written by ``run_all.py``) or, without it, from this machine.
``--check`` exits 1 when the README block differs from what the results give.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Row", "build_rows", "machine_line", "main", "plot_async_vs_sync", "plot_env_evals", "render_block",
           "replace_block"]

HERE = Path(__file__).resolve().parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
CHART = "async_vs_sync.png"
ENVS_CHART = "envs.png"


@dataclass
class Row:
    """One line of the table: what was measured against what, and the target."""

    figure: str
    value: str
    baseline: str
    ratio: float | None
    target: str
    met: bool | None
    source: str


def _num(x: float, unit: str) -> str:
    return f"{x:,.0f} {unit}" if x >= 100 else f"{x:.2f} {unit}"


def _inference_server(d: dict[str, Any]) -> Row:
    return Row(f"Embedded server decode, {d['requests']} concurrent × {d['new_tokens']} new tokens",
               _num(d["server_tokens_per_s"], "tokens/s"),
               f"batched `model.generate`: {_num(d['generate_tokens_per_s'], 'tokens/s')}",
               d["ratio"], f"≥ {d.get('target_ratio', 0.7)}", d.get("meets_target"), "bench_inference_server.py")


def _inference_client(d: dict[str, Any]) -> Row:
    return Row(f"Inference client, {d['requests']:,} requests at {d['concurrency']} concurrent",
               _num(d["client_req_per_s"], "req/s"), f"bare aiohttp loop: {_num(d['bare_aiohttp_req_per_s'], 'req/s')}",
               d["ratio"], f"≥ {d.get('target_ratio', 0.8)}", d.get("meets_target"), "bench_inference_client.py")


def _rollout_overhead(d: dict[str, Any]) -> Row:
    targets = d.get("targets", {})
    target = f"≥ {targets.get('ratio', 0.7)} and ≥ {targets.get('executor_eps_per_s', 2000):,} eps/s"
    return Row(f"Rollout executor, {d['episodes']:,} single-turn episodes at {d['concurrency']} concurrent",
               _num(d["executor_eps_per_s"], "episodes/s"),
               f"bare client loop: {_num(d['bare_client_eps_per_s'], 'episodes/s')}",
               d["ratio"], target, d.get("meets_targets"), "bench_rollout_overhead.py")


def _rollout_async(d: dict[str, Any]) -> Row:
    engine = "embedded server, tiny model" if d.get("backend") == "embedded" else "simulated continuous batching"
    w = d["workload"]
    target = f"≥ {d.get('target_fraction_of_bound', 0.8)} of bound {d['bound']:.2f}×"
    return Row(f"Async RL (η = {d['async']['eta']}) vs sync (η = 0), {w['steps']} steps, {engine}",
               f"{d['async']['wall_s']:.1f} s wall", f"synchronous: {d['sync']['wall_s']:.1f} s",
               d["speedup"], target, d.get("meets_target"),
               "bench_rollout_async.py" + (" --backend embedded" if d.get("backend") == "embedded" else ""))


def _trainer(d: dict[str, Any]) -> Row:
    value = _num(d["engine_train_only_tokens_per_s"], "tokens/s")
    value += f" (whole step with logprob recompute: {_num(d['engine_tokens_per_s'], 'tokens/s')})"
    if "engine_peak_mem_mb" in d:
        value += f", peak {d['engine_peak_mem_mb']:,.0f} MB"
    base = f"padded PyTorch loop: {_num(d['plain_padded_tokens_per_s'], 'tokens/s')}"
    if "plain_peak_mem_mb" in d:
        base += f", peak {d['plain_peak_mem_mb']:,.0f} MB"
    return Row(f"Trainer update, batch {d['batch']}, mixed lengths ({d.get('device', 'cpu')})", value, base,
               d["speedup_train_only_vs_plain"], d.get("target", "—"), d.get("meets_target"), "bench_trainer.py")


def _weight_sync(d: dict[str, Any]) -> Row:
    return Row(f"Weight sync to an embedded server, {d['parameters'] / 1e6:.0f}M parameters ({d['megabytes']:.0f} MB)",
               f"gloo broadcast: {d['gloo_s']:.2f} s", f"disk (safetensors + reload): {d['disk_s']:.2f} s",
               d["ratio"], f"≥ {d.get('target_ratio', 1.0)}", d.get("meets_target"), "bench_weight_sync.py")


def _learning(d: dict[str, Any]) -> Row:
    a, p = d["summary"]["areal"], d["summary"]["plain"]

    def reach(s: dict[str, Any]) -> str:
        t = s["time_to_s"]["0.95"]
        return f"0.95 in {t['mean']:.0f} s ({t['n']}/{t['of']} runs)" if t["n"] else f"0.95 in 0/{t['of']} runs"

    def acc(s: dict[str, Any]) -> str:
        f = s["final_accuracy"]
        return f"accuracy {f['mean']:.2f} (min {f['min']:.2f}, max {f['max']:.2f})"

    def rate(s: dict[str, Any]) -> str:  # trained samples/s: the default command's steps, then the whole budget
        default = s.get("default_run", {}).get("samples_per_s")
        over = f"{s['samples_per_s']['mean']:,.0f} samples/s"
        return f"{default['mean']:,.0f} samples/s in the default 200 steps ({over} over the budget)" if default else over

    def evals(s: dict[str, Any]) -> str:
        share = s.get("default_run", {}).get("eval_share")
        return f", evals {100 * share['mean']:.1f} % of the default command" if share else ""

    runs = f"{len(d['seeds'])} seed{'s' if len(d['seeds']) > 1 else ''}"
    return Row(f"Learning, `run --env math` vs plain sync GRPO loop, same warm start, {d['budget_s']:.0f} s of "
               f"training each, {runs}",
               f"{rate(a)}, {acc(a)}, {reach(a)}{evals(a)}",
               f"plain loop: {rate(p)}, {acc(p)}, {reach(p)}",
               d.get("ratio"), "samples/s ≥ 1.0, time to 0.95 ≤ 0.35, final ≥, evals ≤ 5 %",
               d.get("meets_target"),
               "bench_learning.py")


# results file stem -> row builder; files not listed here (e.g. reliability.json) are not benchmarks
BUILDERS: dict[str, Callable[[dict[str, Any]], Row]] = {
    "inference_server": _inference_server,
    "inference_client": _inference_client,
    "rollout_overhead": _rollout_overhead,
    "rollout_async": _rollout_async,
    "rollout_async_embedded": _rollout_async,
    "trainer": _trainer,
    "weight_sync": _weight_sync,
    "learning": _learning,
}


def build_rows(results: Path) -> tuple[list[Row], list[str]]:
    """Rows for every known results file in ``results``, and one-line problems with the others."""
    rows, problems = [], []
    for stem, build in BUILDERS.items():
        path = results / f"{stem}.json"
        if not path.is_file():
            continue
        try:
            rows.append(build(json.loads(path.read_text())))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            problems.append(f"{path.name}: unreadable ({type(exc).__name__}: {exc})")
    return rows, problems


def machine_line(results: Path) -> str:
    """``machine.json`` of the run (from ``run_all.py``), else a description of this machine."""
    path = results / "machine.json"
    if path.is_file():
        m = json.loads(path.read_text())
        load = m.get("loadavg_before")
        extra = f", load average {load[0]:.1f} at the start" if load else ""
        return (f"Measured {m.get('measured_at', '?')} on {m.get('platform', '?')}, {m.get('cpu_count', '?')} CPUs, "
                f"Python {m.get('python', '?')}, torch {m.get('torch', '?')}{extra}.")
    return (f"Machine (not recorded by run_all.py; this machine): {platform.platform()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}.")


def render_block(rows: list[Row], machine: str, chart: str | None, details: list[str] | None = None) -> str:
    """The Markdown that goes between the markers (``details``: links to per-step charts)."""
    lines = ["(generated by `python benchmarks/run_all.py`; `python benchmarks/report.py` rebuilds it from "
             "`benchmarks/results/*.json`)", "", machine, ""]
    if not rows:
        return "\n".join([*lines, "No benchmark results yet: run `python benchmarks/run_all.py`."])
    lines += ["| figure | value | baseline (same run) | ratio | target | met | script |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "—" if r.ratio is None else f"{r.ratio:.2f}×"
        met = "—" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(f"| {r.figure} | {r.value} | {r.baseline} | {ratio} | {r.target} | {met} | `{r.source}` |")
    if chart:
        lines += ["", f"![async vs sync wall time]({chart})"]
    if details:
        lines += ["", "Steps over time: " + ", ".join(f"[{Path(d).stem}]({d})" for d in details)]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with everything between the bench markers replaced by ``block``."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"the README must contain {START} ... {END} exactly once, in that order")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block}\n{END}{tail}"


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the file backend, imported only where a chart is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path) -> None:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)


def plot_async_vs_sync(results: Path, out: Path) -> bool:
    """Bar chart of sync vs async wall time for each ``rollout_async*.json``; False if none."""
    runs = []
    for stem, label in (("rollout_async", "simulated engine"), ("rollout_async_embedded", "embedded server")):
        path = results / f"{stem}.json"
        if path.is_file():
            d = json.loads(path.read_text())
            runs.append((label, d["sync"]["wall_s"], d["async"]["wall_s"], d["async"]["eta"], d["bound"]))
    if not runs:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.38
    for i, (_label, sync_s, async_s, eta, bound) in enumerate(runs):
        ax.bar(i - width / 2, sync_s, width, color="tab:gray", label="synchronous (η = 0)" if i == 0 else None)
        ax.bar(i + width / 2, async_s, width, color="tab:orange", label="asynchronous" if i == 0 else None)
        ax.text(i + width / 2, async_s, f"{sync_s / async_s:.2f}× (bound {bound:.2f}×, η = {eta})",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(runs)), [r[0] for r in runs])
    ax.set_ylabel("wall time for the same RL steps (s)")
    ax.set_title("Asynchronous vs synchronous RL, same workload")
    ax.legend(loc="upper right")
    _save(fig, out)
    return True


def plot_env_evals(results: Path, out: Path) -> bool:
    """One panel per env of ``envs.json`` (``math`` first): greedy success at each eval of each
    seed's run against its RL step, the 0.80 end level of the envs' bar dotted; False without the file."""
    path = results / "envs.json"
    if not path.is_file():
        return False
    envs = json.loads(path.read_text())["envs"]
    names = sorted(envs, key=lambda name: (name != "math", name))
    plt = _pyplot()
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.7 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for run in envs[name]["runs"]:
            if run.get("ok"):
                steps, success = zip(*run["evals"], strict=True)
                ax.plot(steps, success, marker="o", markersize=3, label=f"seed {run['seed']}")
        ax.axhline(0.8, color="tab:gray", linestyle=":", linewidth=1)
        ax.set_title(f"{name} ({envs[name]['date']})", fontsize=9)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.supxlabel("RL step", fontsize=9)
    fig.supylabel("greedy success, held-out rows", fontsize=9)
    _save(fig, out)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(HERE / "results"), help="directory of the JSON results")
    p.add_argument("--readme", default=str(HERE.parent / "docs" / "benchmarks.md"),
                   help="the page to update between the markers (default: docs/benchmarks.md)")
    p.add_argument("--check", action="store_true", help="only check that the README block is up to date")
    args = p.parse_args(argv)
    results, readme = Path(args.results), Path(args.readme)
    if not results.is_dir():
        print(f"error: no results directory {results}", file=sys.stderr)
        return 2
    rows, problems = build_rows(results)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    chart_path = results / CHART
    has_chart = plot_async_vs_sync(results, chart_path) if not args.check else chart_path.is_file()
    has_envs_chart = not args.check and plot_env_evals(results, results / ENVS_CHART)
    try:
        chart = os.path.relpath(chart_path, readme.resolve().parent) if has_chart else None
        text = readme.read_text(encoding="utf-8")
        base = readme.resolve().parent
        details = [os.path.relpath(results / f"{stem}.png", base) for stem in ("rollout_async", "rollout_async_embedded")
                   if (results / f"{stem}.png").is_file()]
        new = replace_block(text, render_block(rows, machine_line(results), chart, details))
    except (OSError, ValueError) as exc:
        print(f"error: {readme}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"{readme}: the performance table is stale; run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new, encoding="utf-8")
    print(f"{readme}: {len(rows)} benchmark rows" + (f", chart {chart_path}" if has_chart else "")
          + (f", chart {results / ENVS_CHART}" if has_envs_chart else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
