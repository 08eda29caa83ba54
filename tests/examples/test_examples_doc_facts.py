"""Numbers the docs quote are those of their sources: config defaults, the envs' defaults and recipes,
``docs/benchmarks.md`` and ``benchmarks/results/*.json``. A default changed in the code, or a
figure re-measured, fails here until the docs say the same."""

from __future__ import annotations

import json
import re

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
