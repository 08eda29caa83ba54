"""Numbers the docs quote are those of their sources: config defaults, the envs' defaults and recipes,
``docs/benchmarks.md`` and ``benchmarks/results/*.json``. A default changed in the code, or a
figure re-measured, fails here until the docs say the same: every figure of the benchmarks page
that has a results file is rebuilt here from that file."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from examples_support import DOCS, ROOT

from areal_agents.config.doc import builtin_env_defaults
from areal_agents.config.loader import config_fields

DEFAULTS = {key: default for key, _, default, _ in config_fields()}
NUMBER = r"(-?\d[\d.]*(?:e-?\d+)?)"
KEY = r"`([a-z_]+\.[a-z_.]+)`"

# "`key` (N", "`key` = N", "`key`, N", "`key` steps (N by default": a global default stated next to its key
STATED_DEFAULT = re.compile(KEY + r"(?: \(| = |, |[^`\n(]{0,24}\()" + NUMBER + r"(?![\d.])")
# "`key` ... the `env` env sets N": an env's value (its default_config or its recipe)
STATED_ENV_VALUE = re.compile(KEY + r"[^`]{0,80}?the `([a-z-]+)` env sets\s+" + NUMBER)

# (doc, key) pairs that quote a recipe's value rather than the default, with where that value comes from
RECIPE_VALUES = {
    ("examples/gsm8k_grpo/README.md", "actor.lr"): ("examples/gsm8k_grpo/gpu.yaml", "actor.lr"),
}


def _text(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def _yaml_value(path: str, key: str) -> object:
    node = yaml.safe_load(_text(path))
    for part in key.split("."):
        node = node[part]
    return node


def test_quoted_defaults_are_the_code_s() -> None:
    checked, wrong = 0, []
    for doc in DOCS:
        if doc == "docs/config.md":  # generated from the same dataclasses (tests/config/test_config.py)
            continue
        for key, value in STATED_DEFAULT.findall(_text(doc)):
            if key not in DEFAULTS:
                continue
            source = RECIPE_VALUES.get((doc, key))
            expected = _yaml_value(*source) if source else DEFAULTS[key]
            checked += 1
            if not isinstance(expected, (int, float)) or float(value) != float(expected):
                wrong.append(f"{doc}: `{key}` quoted as {value}, the source says {expected!r}")
    assert not wrong, wrong
    assert checked >= 6  # the scan finds the quotes it is meant to check


def test_quoted_env_defaults_are_the_env_s() -> None:
    env_defaults = builtin_env_defaults()
    found = [(doc, *m) for doc in DOCS for m in STATED_ENV_VALUE.findall(_text(doc))]
    assert len(found) >= 2, found
    for doc, key, env, value in found:
        assert float(env_defaults[env][key]) == float(value), (doc, key, env, value)


def test_readme_s_default_run_facts() -> None:
    readme = _text("README.md")
    math = builtin_env_defaults()["math"]
    steps, rows = re.search(r"then runs (\d+) steps of async GRPO and evaluates on\s+(\d+) held-out sums", readme).groups()
    assert int(steps) == math["trainer.total_steps"] and int(rows) == DEFAULTS["data.test_size"]
    listed = re.search(r"Built-in envs: (.*?) \(`areal-agents list envs`\)", readme, re.S).group(1)
    assert set(re.findall(r"`([a-z-]+)`", listed)) == set(builtin_env_defaults())


def test_warm_start_steps_quoted_in_the_quickstart_are_the_benchmark_s() -> None:
    table = _text("docs/benchmarks.md").split("## Learning: the default `math` run", 1)[1]
    steps = [int(s) for s in re.findall(r"^\| \d \| (\d+) steps, ", table, re.M)]
    assert len(steps) == 5
    quoted = re.search(r"took (\d+)–(\d+) steps", _text("docs/quickstart.md")).groups()
    assert (int(quoted[0]), int(quoted[1])) == (min(steps), max(steps))


def test_readme_results_figures_are_on_the_pages_they_link() -> None:
    readme = _text("README.md")
    table = readme.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 4
    for row in rows:
        target = re.search(r"\]\((docs/[^)#]+)", row).group(1)
        page = _text(target).replace("−", "-")
        figures = re.findall(r"[+]?\d+\.\d+|\d+ min \d+ s|\d+ s\b|\b\d{3,}\b", row.split("|")[2])
        assert figures, row
        missing = [f for f in figures if f not in page]
        assert not missing, (target, missing)


def test_gpu_figures_are_the_gpu_check_s() -> None:
    runs = [json.loads((ROOT / "benchmarks" / "results" / "gpu_check_cuda" / name).read_text())["steps"]
            for name in ("summary.json", "summary_run2.json")]
    before = {r["rl"]["accuracy_before"] for r in runs}
    after = sorted(r["rl"]["accuracy_after"] for r in runs)
    parity = {round(r["parity"]["mean_abs_diff"], 4) for r in runs}
    assert len(before) == 1 and len(parity) == 1
    gpu, faq = _text("docs/gpu.md"), _text("docs/faq.md")
    start = f"{before.pop():.3f}"
    assert f"{start} → {after[1]:.3f} and\n    {start} → {after[0]:.3f}" in gpu
    mean = f"{parity.pop():.4f}"
    assert f"mean difference {mean}" in gpu and f"differ by {mean} on average" in faq
    assert f"max {max(r['parity']['max_abs_diff'] for r in runs):.3f}" in faq
    page = _section("GPU check")
    for r in runs:
        assert f"{r['rl']['accuracy_before']:.3f} → {r['rl']['accuracy_after']:.3f}, {r['rl']['wall_s']:.0f} s" in page
        assert f"{r['parity']['mean_abs_diff']:.4f}, {r['parity']['max_abs_diff']:.3f}" in page


BENCHMARKS = "docs/benchmarks.md"


def _results(name: str) -> Any:
    return json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())


def _section(title: str) -> str:
    """The section ``## title`` of the benchmarks page, its white space folded to single spaces."""
    text = _text(BENCHMARKS).split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return " ".join(text.split())


def _s(seconds: float) -> str:  # a whole command or a warm start, rounded half up: "48 s", "1 min 53 s"
    whole = int(seconds + 0.5)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60:02d} s"


def _spread(d: dict, fmt: str, sep: str = "–", unit: str = "") -> str:  # "69 s (36–86)"
    return f"{d['mean']:{fmt}}{unit} ({d['min']:{fmt}}{sep}{d['max']:{fmt}})"


def _learning(d: dict) -> list[str]:
    a, p = d["summary"]["areal"], d["summary"]["plain"]
    out = [f"**{d['time_to_095_ratio']:.2f}×**", f"**{d['default_samples_per_s_ratio']:.2f}×**",
           f"{d['time_to_090_ratio']:.2f}×", f"{d['samples_per_s_ratio']:.2f}×", f"{d['generated_per_s_ratio']:.2f}×",
           f"{d['signal_per_s_ratio']:.2f}×", f"{d['final_accuracy_gap']:+.3f}",
           f"{100 * d['eval_share']:.1f} % ({100 * a['default_run']['eval_share']['min']:.1f}–"
           f"{100 * a['default_run']['eval_share']['max']:.1f})", _spread(a["default_run"]["samples_per_s"], ".0f")]
    for s in (a, p):
        out += [_spread(s["time_to_s"][level], ".0f", unit=" s") for level in ("0.80", "0.90", "0.95")]
        out += [" / ".join(f"{x['mean']:.3f}" for x in s["accuracy_at_min"].values()),  # the marks within the budget
                _spread(s["final_accuracy"], ".3f"), _spread(s["generated_per_s"], ".0f"),
                _spread(s["signal_per_s"], ".0f"), _spread(s["samples_per_s"], ".0f")]
    return out


def _credit(d: dict) -> list[str]:  # each arm's row, from its first level on: "32 s [30-33] | ... | 312-336"
    def cell(x: dict, fmt: str, unit: str = "") -> str:
        return f"{x['mean']:{fmt}}{unit} [{x['min']:{fmt}}-{x['max']:{fmt}}]"

    return [" | ".join([*(cell(s["time_to_s"][level], ".0f", " s") for level in ("0.70", "0.80", "0.90")),
                        cell(s["final_success"], ".3f"), f"{s['steps']['min']}-{s['steps']['max']}"])
            for s in d["summary"].values()]


def _train_cost(d: dict) -> list[str]:
    out = []
    for s in d["summary"].values():
        run, alone = s["run"], s["alone"]
        trained, computed = run["trained_tokens_per_step"], run["computed_tokens_per_step"]
        out += [f"{trained:,} / {computed:,} / {run['tokens_per_step']:,}",
                _spread(run["ms_per_token"], ".3f", "-"), f"{computed / trained:.2f}",
                f"{run['ms_per_computed_token']['mean']:.3f} / {alone['ms_per_computed_token']['mean']:.3f}",
                f"{run['ms_per_computed_token']['ratio_to_math']:.2f}× / {alone['ms_per_computed_token']['ratio_to_math']:.2f}×"]
        out += [f"{x['ms_per_token']['ratio_to_math']:.2f}×" for x in (run, alone)]
    return out


def _contention(d: dict) -> list[str]:
    return [" | ".join([*(_spread({**s[k], "mean": s[k]["median"]}, ".1f", "-", " s") for k in ("alone_s", "busy_s")),
                        f"{'**' if key.startswith('default/') else ''}{s['ratio']:.2f}x"])
            for key, s in d["summary"].items()]


def _long_episode(d: dict) -> list[str]:
    rows = {(r["length"], r["checkpointing"]): r for r in d["rows"]}

    def memory(r: dict) -> str:
        return f"+{r['peak_growth_mb']:.0f} MB ({r['kb_per_token']:.1f} kB/token)"

    return [f"| {n:,} | {memory(rows[n, False])} | {memory(rows[n, True])} | "
            f"{rows[n, False]['seconds']:.2f} / {rows[n, True]['seconds']:.2f} s |" for n in sorted({n for n, _ in rows})]


def _online(d: dict) -> list[str]:
    per_s = d["per_s"]
    return [f"{per_s['gateway_call']:.1f} calls/s through the gateway against {per_s['episode']:.1f}",
            f"({d['gateway_call_vs_episode']:.2f}x)", f"{per_s['gateway_session']:.1f} whole sessions/s"]


def _judge(d: dict) -> list[str]:
    py, judge = d["summary"]["python"], d["summary"]["judge"]
    calls = judge["judge_calls_per_s"]
    return [_spread(py["step_s"], ".3f", "-", " s"), _spread(judge["step_s"], ".2f", "-", " s"),
            f"**{judge['step_s_ratio_to_python']:.1f}×**",
            f"{calls['mean']:.0f} judge calls a second ({calls['min']:.0f}-{calls['max']:.0f})",
            _spread(py["accuracy_after"], ".3f", "-"), _spread(judge["accuracy_after"], ".3f", "-")]


def _record(d: dict) -> list[str]:
    read, train, run = d["read"], d["train"], d["run"]
    return [f"{read['summary_cold_s']:.2f} s / {read['summary_warm_s']:.2f} s", f"{read['episode_lookup_s']:.3f} s",
            f"{train['bytes_per_1000_episodes']:,}", f"{train['handoff_s'] * 1000:.2f} ms a step",
            *(f"median {100 * x['cost']:+.1f} %, range {100 * x['cost_min']:+.1f} to {100 * x['cost_max']:+.1f} %"
              for x in (run, train))]


# section of docs/benchmarks.md -> (results file, the strings its figures must appear as)
RESULTS_SECTIONS: dict[str, tuple[str, Callable[[Any], list[str]]]] = {
    "Learning speed: areal-agents against a plain loop": ("learning", _learning),
    "Multi-turn credit: episode GRPO, turn credit and GiGPO": ("credit", _credit),
    "Training cost of multi-turn episodes": ("train_cost", _train_cost),
    "A busy machine: the fair share": ("contention", _contention),
    "Long episodes: the trainer's memory per token": ("long_episode", _long_episode),
    "Online RL: an app outside the run trains it": ("online", _online),
    "Rewards from models": ("judge", _judge),
    "The episode record": ("record", _record),
}


@pytest.mark.parametrize("title", RESULTS_SECTIONS)
def test_benchmark_figures_are_their_results_files(title: str) -> None:
    name, expected = RESULTS_SECTIONS[title]
    section = _section(title)
    assert f"(../benchmarks/results/{name}.json)" in section, title  # the section links its file
    figures = expected(_results(name))
    missing = [figure for figure in figures if figure not in section]
    assert len(figures) >= 3 and not missing, (title, missing)


def test_default_math_runs_are_the_envs_results() -> None:
    runs, section = _results("envs")["envs"]["math"]["runs"], _section("Learning: the default `math` run")
    for r in runs:
        evals = dict(r["evals"])
        assert (f"| {r['seed']} | {r['warm_start']['steps']} steps, {_s(r['warm_start']['seconds'])} | "
                f"{r['before']:.3f} → {r['after']:.3f} ({100 * r['gain']:+.1f} points; "
                f"{evals[50]:.3f} / {evals[100]:.3f} / {evals[150]:.3f}) | {_s(r['seconds'])} |") in section, r["seed"]
    mean = {k: statistics.fmean(r[k] for r in runs) for k in ("before", "after", "gain", "seconds")}
    ends, gains, times = ([r[k] for r in runs] for k in ("after", "gain", "seconds"))
    assert (f"| {mean['before']:.3f} → {mean['after']:.3f} ({min(ends):.3f}–{max(ends):.3f}); gain "
            f"{100 * mean['gain']:+.1f} points ({100 * min(gains):+.1f} to {100 * max(gains):+.1f}) | "
            f"{_s(mean['seconds'])} ({_s(min(times))[:-2]}–{_s(max(times))}) |") in section


def test_env_table_is_the_envs_results() -> None:
    section = _section("Built-in envs with their default commands")
    assert "(../benchmarks/results/envs.json)" in section and "(../benchmarks/results/envs.png)" in section
    for name, entry in _results("envs")["envs"].items():
        runs, summary = entry["runs"], entry["summary"]
        before = [r["before"] for r in runs]
        after, gain, seconds = summary["after"], summary["gain"], summary["seconds"]
        row = (f"| `{name}` | {entry['date']} | {len(runs)} | {min(before):.3f}–{max(before):.3f} → "
               f"{after['min']:.3f}–{after['max']:.3f} | {100 * gain['min']:+.1f} to {100 * gain['max']:+.1f} | "
               f"{_s(seconds['min'])}–{_s(seconds['max'])} | ")
        met = f"{summary['met']} of {summary['runs']}"
        assert row + met in section or row + f"**{met}**" in section, (name, row)
        if summary["met"] < summary["runs"]:  # a seed below the bar is spelt out: where each ended, the time
            assert f"meets the bar in {met} seeds" in section, name
            failed = [r for r in runs if not r["met"]]
            assert all(f"{r['after']:.3f}" in section for r in runs), name
            assert all(f"at {r['warm_start']['stopped_at']:.2f} on its check" in section for r in failed), name
            assert f"{seconds['min'] / 60:.1f}–{seconds['max'] / 60:.1f} min" in section, name


def _ranges(cell: str) -> list[tuple[float, float, int]]:
    """Each "lo–hi" of a table cell, with the decimals hi is written to."""
    return [(float(lo.replace(",", "")), float(hi.replace(",", "")), len(hi.partition(".")[2]))
            for lo, hi in re.findall(r"([\d,.]+)–([\d,.]+)", cell)]


def test_openai_path_ranges_hold_the_results_run() -> None:
    """The page gives ranges over 3 runs; the results file holds the last, which must lie in each."""
    d, section = _results("openai_overhead"), _section("OpenAI-compatible agents")
    assert "(../benchmarks/results/openai_overhead.json)" in section
    rows = {"instant": "| instant endpoint", "model": "| tiny model, every reply 24", "varied": "| **tiny model, replies of"}
    for key, start in rows.items():
        cells = section.split(start, 1)[1].split(" | |", 1)[0].split(" | ")[1:4]
        r = d[key]
        values = [[r["openai_vs_native"]], [r["http_vs_openai"], r["http_aiohttp_vs_openai"]],
                  [r["eps_per_s"]["openai"], r["eps_per_s"]["http_aiohttp"]]]
        for cell, figures in zip(cells, values, strict=True):
            spans = _ranges(cell)
            assert len(spans) == len(figures), (key, cell)
            for (lo, hi, decimals), figure in zip(spans, figures, strict=True):
                assert lo <= round(figure, decimals) <= hi, (key, cell, figure)
