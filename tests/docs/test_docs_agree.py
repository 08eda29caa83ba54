"""Quantities the docs quote in more than one place say the same everywhere.

Each named quantity has a source of truth (the code, or ``benchmarks/results/*.json``) and, per page
that quotes it, a pattern whose groups are the quote; every quote must equal the source, written as
the docs write it. A re-measured figure or a changed default fails here on every page that still
quotes the old one. The benchmark pages themselves (``docs/benchmarks*.md``: every run, old ones
included) and the changelog (history) are not scanned; the pages that quote their figures are.
Besides the table: tables of config defaults on any page agree with the config, the quickstart's
outputs are what ``docs/run_dir.md`` says a default run writes, and the README's results table has
one row per capability."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from areal_agents.config.doc import builtin_algorithm_defaults, builtin_env_defaults
from areal_agents.config.loader import config_fields
from trainers import tiny_model

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")
                             if not p.name.startswith("benchmarks") and p.name != "changelog.md"),
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("README.md"))]
_FIELDS = {key: default for key, _, default, _ in config_fields()}
# What a run uses when nothing sets a key: the dataclass, under the default algorithm's own defaults.
DEFAULTS = {**_FIELDS, **builtin_algorithm_defaults()[_FIELDS["algorithm.name"]]}
WORDS = {3: "three", 4: "four", 5: "five"}


def _json(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def _text(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def _dashes(text: str) -> str:
    """A range written with a hyphen is the same range: 1.57-1.73 == 1.57–1.73."""
    return re.sub(r"(?<=\d)-(?=[+\d])", "–", text)


def _min_s(seconds: float) -> str:
    whole = int(seconds + 0.5)
    return f"{whole // 60} min {whole % 60:02d} s"


def _r(value: float) -> int:
    return int(value + 0.5)  # half up, as the pages round


# -- the sources of truth ---------------------------------------------------------------------------

def tiny_vocabulary() -> str:
    """The smallest vocabulary the builder makes (bytes, specials, message headers): `math`'s, whose
    built model tests/trainers/test_trainer_tiny_model.py checks against the README."""
    return str(256 + len(tiny_model._ADDED_TOKENS))


def tiny_parameters() -> str:
    """Parameters of the tiny Qwen2 model at `math`'s vocabulary: tied embeddings, q/k/v biases, RMSNorms."""
    d = tiny_model._DEFAULTS
    h, mlp, kv = d["hidden_size"], d["intermediate_size"], d["hidden_size"] // d["num_heads"] * d["num_kv_heads"]
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * mlp + 2 * h
    return f"{int(tiny_vocabulary()) * h + d['num_layers'] * layer + h:,}"


def _env(name: str) -> dict[str, Any]:
    return _json("envs.json")["envs"][name]


def math_run() -> str:
    s, runs = _env("math")["summary"], _env("math")["runs"]
    before = sum(r["before"] for r in runs) / len(runs)
    gain = " / ".join(f"{100 * s['gain'][k]:.1f}" for k in ("mean", "min", "max"))
    return f"{gain} / {before:.3f} / {s['after']['mean']:.3f} / {_r(s['seconds']['mean'])} s / {len(runs)}"


def math_run_rounded() -> str:
    runs = _env("math")["runs"]
    return f"{sum(r['before'] for r in runs) / len(runs):.2f} / {sum(r['after'] for r in runs) / len(runs):.2f}"


def math_run_in_words() -> str:
    """Every seed under 60 s: "under"; a mean within 15 s of it: "about"; else "over"."""
    seconds = _env("math")["summary"]["seconds"]
    return "under a minute" if seconds["max"] < 60 else "about a minute" if seconds["mean"] < 75 else "over a minute"


def math_warm_start() -> str:
    runs = [r["warm_start"] for r in _env("math")["runs"]]
    steps, secs = [r["steps"] for r in runs], [r["seconds"] for r in runs]
    return f"{min(steps)} / {max(steps)} / {_r(min(secs))} / {_r(max(secs))} / {WORDS[len(runs)]}"


def math_multiturn() -> str:
    s = _env("math-multiturn")["summary"]
    return (f"{100 * s['gain']['min']:.1f} / {100 * s['gain']['max']:.1f} / "
            f"{_min_s(s['seconds']['min'])} / {_min_s(s['seconds']['max'])}")


def ends(env: str) -> Callable[[], str]:
    """Where ``env``'s default runs ended, lowest–highest."""
    return lambda: f"{_env(env)['summary']['after']['min']:.3f}–{_env(env)['summary']['after']['max']:.3f}"


def python_tool() -> str:
    """Where ``python-tool``'s default runs ended and what they gained, lowest–highest, and their seconds."""
    runs = _env("python-tool")["runs"]
    after, gain, secs = (sorted(r[k] for r in runs) for k in ("after", "gain", "seconds"))
    return " / ".join([f"{after[0]:.3f}", f"{after[-1]:.3f}", f"{100 * gain[0]:.1f}", f"{100 * gain[-1]:.1f}",
                       _min_s(secs[0]), _min_s(secs[-1])])


def unit_convert_table() -> str:
    rows = []
    for r in _env("unit-convert")["runs"]:
        evals = ", ".join(f"{acc:.3f}" for step, acc in r["evals"] if step)
        rows.append(f"| {r['seed']} | {r['warm_start']['steps']} steps, {_r(r['warm_start']['seconds'])} s | "
                    f"{r['before']:.3f} → {r['after']:.3f} (+{100 * r['gain']:.1f} points; {evals}) | "
                    f"{_min_s(r['seconds'])} |")
    return "\n".join(rows)


def async_vs_sync() -> str:
    d = _json("learning.json")
    s = d["summary"]
    ours, plain = s["areal"]["time_to_s"]["0.95"]["mean"], s["plain"]["time_to_s"]["0.95"]["mean"]
    finals = (s[name]["final_accuracy"]["mean"] for name in ("areal", "plain"))
    return (f"{_r(ours)} / {_r(plain)} / {d['time_to_095_ratio']:.2f} / "
            f"{' / '.join(f'{x:.3f}' for x in finals)} / {d['default_samples_per_s_ratio']:.2f}")


def async_speedups() -> str:
    ups = sorted(_json(f)["speedup"] for f in ("rollout_async.json", "rollout_async_embedded.json"))
    return f"{ups[0]:.2f}–{ups[-1]:.2f}"


def eval_rows() -> str:
    assert DEFAULTS["eval.n"] is None  # None: every row of data.test_size
    return str(DEFAULTS["data.test_size"])


def judge_gain() -> str:
    """The README's judge row, from which its highlight quotes the gain."""
    before, after, steps = re.search(r"exact-match accuracy (0\.\d+) → (0\.\d+) in (\d+) steps", _text("README.md")).groups()
    return f"{100 * (float(after) - float(before)):.1f} / {steps}"


@dataclass(frozen=True)
class Quantity:
    name: str
    truth: Callable[[], str] | None  # the figure as the pages write it; None: the quotes must agree among themselves
    quotes: dict[str, str]  # page ("*": every page) -> pattern; its groups, joined by " / ", are the quote
    least: int = 1  # quotes the patterns must find, so that a reworded page cannot pass by quoting nothing


QUANTITIES = [
    Quantity("the tiny model's parameters (math)", tiny_parameters,
             {"*": r"tiny[^.]{0,60}?[(,] ?(\d{3},\d{3}) parameters"}, least=4),
    Quantity("the tiny model's vocabulary (math)", tiny_vocabulary, {"*": r"(\d+)-token (?:byte-level BPE|vocabulary)"}),
    Quantity("the default run: gain (mean, min, max), accuracy before and after, wall time, seeds", math_run,
             {"README.md": r"\+(\d+\.\d) points greedy accuracy \(\+(\d+\.\d) to \+(\d+\.\d)\), (0\.\d{3}) → (0\.\d{3}), "
                           r"in (\d+ s) for the whole command; (\d) seeds"}),
    Quantity("the default run's accuracy, two places", math_run_rounded,
             {"README.md": r"from (0\.\d+) to (0\.\d+) greedy accuracy"}),
    Quantity("the default run's wall time in words", math_run_in_words,
             {"README.md": r"500 held-out sums: (\w+ a minute) on 2 CPU cores",
              "docs/index.md": r"trains a tiny model: (\w+ a minute) on 2 cores"}, least=2),
    Quantity("the default run's warm start: steps, seconds, seeds", math_warm_start,
             {"docs/quickstart.md": r"took (\d+)–(\d+) steps and (\d+)–(\d+) s on 2 cores in (\w+) seeds"}),
    Quantity("math-multiturn's default runs: gain, wall time", math_multiturn,
             {"README.md": r"`math-multiturn` \(?\+(\d+\.\d) to \+(\d+\.\d) points in (\d+ min \d+ s)–(\d+ min \d+ s)"}),
    *(Quantity(f"where {env}'s default runs ended", ends(env), {"README.md": rf"`{env}` \(?(?:ends )?(0\.\d+[–-]0\.\d+)"})
      for env in ("guess-number", "countdown", "unit-convert")),
    Quantity("python-tool's default runs: their ends, gains and times", python_tool,
             {"README.md": r"by `python-tool` \(ends (0\.\d+)–(0\.\d+), \+(\d+\.\d) to \+(\d+\.\d) points, in "
                           r"(\d+ min \d+ s)–(\d+ min \d+ s)\)"}),
    Quantity("unit-convert's default run, seed by seed", unit_convert_table,
             {"docs/byo_agent.md": r"Learning figure: .*?\n\|---\|---\|---\|---\|\n(.*?)\n\n"}),
    Quantity("async RL against a plain loop: time to 0.95, its ratio, final accuracies, trained samples/s",
             async_vs_sync,
             {"README.md": r"first 0\.95 accuracy after (\d+) s against (\d+) s \((0\.\d+)×\); final (0\.\d+) against "
                           r"(0\.\d+); (\d\.\d+)× the trained samples/s"}),
    Quantity("η = 4 against η = 0, wall time", async_speedups,
             {"docs/concepts.md": r"(\d\.\d+[–-]\d\.\d+)× less wall time", "docs/faq.md": r"(\d\.\d+[–-]\d\.\d+)× less wall time"},
             least=2),
    Quantity("rows an eval plays by default", eval_rows,
             {"README.md": r"evaluates on\s+(\d+) held-out sums", "docs/gpu.md": r"None \(all of `data\.test_size`, (\d+)\)",
              "docs/byo_agent.md": r"greedy success on (\d+) held-out questions"}, least=3),
    Quantity("the tiny judge's gain and steps", judge_gain, {"README.md": r"teaches `math`\s+\(\+(\d+\.\d) points in (\d+) steps\)"}),
    # benchmarks/results/reliability.json holds a later test run's figures, not the CI run both pages quote
    Quantity("a server killed in the rollout: episodes submitted and accepted", None,
             {"README.md": r"a server killed mid-run: (\d+) submitted = (\d+) accepted",
              "docs/reliability.md": r"(\d+) submitted = (\d+) accepted \+ \d+ failed \+ \d+ dropped; \d+ failovers"}, least=2),
    Quantity("the test suite's size", None, {"README.md": r"about ([\d,]+) tests"}),
    Quantity("the test suite's time on CI", None, {"README.md": r"about (\d+ min) for about [\d,]+ tests"}),
]


def quotes_of(quantity: Quantity, texts: dict[str, str]) -> list[tuple[str, str]]:
    """(page, quote) for every match of the quantity's patterns."""
    found = []
    for where, pattern in quantity.quotes.items():
        for page in (PAGES if where == "*" else [where]):
            for match in re.finditer(pattern, texts[page], re.S):
                found.append((page, _dashes(" / ".join(match.groups()))))
    return found


def disagreements(quantities: list[Quantity], texts: dict[str, str]) -> list[str]:
    wrong = []
    for q in quantities:
        found = quotes_of(q, texts)
        if len(found) < q.least:
            wrong.append(f"{q.name}: {len(found)} quotes found, expected at least {q.least}: reworded?")
        truth = q.truth() if q.truth is not None else (found[0][1] if found else None)
        wrong += [f"{q.name}: {page} says {quote!r}, the source says {truth!r}" for page, quote in found if quote != truth]
    return wrong


def test_every_quote_of_a_quantity_is_its_source_s() -> None:
    texts = {page: _text(page) for page in PAGES}
    assert disagreements(QUANTITIES, texts) == []


def test_a_planted_disagreement_is_caught() -> None:
    """The check is not vacuous: each of these edits to a page makes it fail, naming the quantity."""
    texts = {page: _text(page) for page in PAGES}
    planted = {
        "docs/gpu.md": ("(822,784 parameters", "(824,000 parameters"),
        "docs/index.md": ("about a minute on 2 cores", "under a minute on 2 cores"),
        "docs/faq.md": ("1.57-1.73×", "1.57-1.75×"),
        "README.md": ("about 1,110 tests", "about 1,110 tests; about 990 tests"),
    }
    for page, (old, new) in planted.items():
        assert old in texts[page], (page, old)
        wrong = disagreements(QUANTITIES, {**texts, page: texts[page].replace(old, new)})
        assert len(wrong) == 1 and page in wrong[0], (page, wrong)


@pytest.mark.slow  # collects the whole suite: about a minute on 2 busy cores
def test_the_quoted_test_count_is_about_the_suite_s() -> None:
    """"About N tests" is within 5% of what pytest collects (with the suite's default markers)."""
    quoted = int(re.search(r"about ([\d,]+) tests", _text("README.md")).group(1).replace(",", ""))
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600).stdout
    collected = int(re.search(r"^(\d+)(?:/\d+)? tests? collected", out, re.M).group(1))
    assert abs(quoted - collected) <= 0.05 * collected, (quoted, collected)


def test_no_page_rounds_the_tiny_model_another_way() -> None:
    vague = re.compile(r"~ ?1M\b|\b1M-parameter|\b\d+k-parameter")
    assert [(page, m.group()) for page in PAGES for m in vague.finditer(_text(page))] == []


# -- tables of defaults -------------------------------------------------------------------------------

def _literal(cell: str) -> Any:
    """A default as a table writes it: `0.8`, 2e-4, none, false, float32, None (all of ...)."""
    text = re.sub(r"\s*\(.*\)$", "", cell.strip()).strip("`' ")
    if text.lower() in ("none", "null", "-"):
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _same(quoted: Any, default: Any) -> bool:
    if isinstance(default, bool) or default is None or isinstance(quoted, bool) or quoted is None:
        return quoted is default
    if isinstance(default, (int, float)):
        return isinstance(quoted, (int, float)) and float(quoted) == float(default)
    return str(quoted) == str(default)


def default_tables(text: str) -> list[tuple[list[str], list[Any]]]:
    """(keys, defaults) of each row of every table with a "key" and a "default" column; a cell of several
    keys (`a.b` / `a.c`, `a.b` × `c`) pairs with a cell of as many values, a key without a section takes
    the first key's."""
    rows = []
    for table in re.findall(r"^(\|.*\|\n\|[-| ]+\|\n(?:\|.*\|\n?)+)", text, re.M):
        lines = table.strip().splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        if "key" not in header or "default" not in header:
            continue
        k, d = header.index("key"), header.index("default")
        for line in lines[2:]:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            keys = re.findall(r"`([a-z_][a-z_.]*)`", cells[k])
            keys = [key if "." in key or key in DEFAULTS or not keys else f"{keys[0].rsplit('.', 1)[0]}.{key}"
                    for key in keys]
            values = [_literal(v) for v in re.split(r" / | × |, ", cells[d])]
            if keys and len(keys) == len(values) and all(key in DEFAULTS for key in keys):
                rows.append((keys, values))
    return rows


def test_tables_of_defaults_on_any_page_are_the_config_s() -> None:
    checked, wrong = 0, []
    for page in PAGES:
        if page == "docs/config.md":  # generated from the config (tests/config/test_config.py)
            continue
        for keys, values in default_tables(_text(page)):
            for key, value in zip(keys, values, strict=True):
                checked += 1
                if not _same(value, DEFAULTS[key]):
                    wrong.append(f"{page}: `{key}` default {value!r}, the config says {DEFAULTS[key]!r}")
    assert wrong == []
    assert checked >= 20  # gpu.md's, faq.md's and online.md's tables


def test_a_wrong_default_in_a_table_is_caught() -> None:
    table = "| key | default | here |\n|---|---|---|\n| `actor.dtype` / `actor.grad_reduce_dtype` | float32 / - | x |\n"
    (keys, values), = default_tables(table)
    assert keys == ["actor.dtype", "actor.grad_reduce_dtype"]
    assert [_same(v, DEFAULTS[k]) for k, v in zip(keys, values, strict=True)] == [True, False]
    (keys, values), = default_tables("| key | default |\n|---|---|\n| `eval.n` | 500 |\n")
    assert not _same(values[0], DEFAULTS["eval.n"])


# -- what a run writes, and the README's results ------------------------------------------------------

def _first_column(table: str) -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", table, re.M)


def test_the_quickstart_lists_what_run_dir_md_says_a_default_run_writes() -> None:
    quick = _text("docs/quickstart.md").split("Outputs go to", 1)[1].split("\n\n", 2)[1]
    listed = {re.sub(r"\*\.png$", "", name) for name in _first_column(quick)}
    run_dir = _text("docs/run_dir.md").split("## The run directory", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in run_dir.splitlines() if line.startswith("| `")]
    default = {_first_column(row + "\n")[0] for row in rows if not row.rstrip(" |").rsplit("|", 1)[1].strip().startswith("only")}
    assert len(default) >= 8
    assert listed == default


def _results_rows() -> list[list[str]]:
    table = _text("README.md").split("## Results", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and "---" not in line][1:]


def learning_rows(rows: list[list[str]]) -> dict[str, list[str]]:
    """env -> the capabilities (rows) quoting a learning figure of it: `env` then an accuracy or range."""
    quoted: dict[str, list[str]] = {}
    for env in builtin_env_defaults():
        pattern = re.compile(rf"`{re.escape(env)}`[^;|`]{{0,40}}?\b0\.\d{{2,3}}(?: → |–|-)0\.\d{{2,3}}")
        quoted[env] = [row[0] for row in rows if pattern.search(row[1])]
    return quoted


def test_the_readme_s_results_have_one_row_per_capability() -> None:
    rows = _results_rows()
    capabilities = [row[0] for row in rows]
    assert len(capabilities) >= 6 and len(set(capabilities)) == len(capabilities)
    twice = {env: where for env, where in learning_rows(rows).items() if len(where) > 1}
    assert twice == {}
    planted = [*rows, ["OpenAI-client agents, again", "`unit-convert` (through the OpenAI path) ends 0.95–0.99", ""]]
    assert list(learning_rows(planted)["unit-convert"]) == ["multi-turn and tool envs", "OpenAI-client agents, again"]
