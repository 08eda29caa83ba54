"""examples/custom_env: a separate package registers an env, reward and dataset through entry points.

The package is pip-installed (editable, no deps) into a throw-away virtual environment that
otherwise sees this interpreter's packages, so the test never changes the interpreter other
tests use; then `areal-agents run --env sort-digits` trains it from that environment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from examples_support import ROOT, TINY, package_env, run_command, train_steps

PKG = ROOT / "examples" / "custom_env" / "pkg"


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = package_env(tmp_path_factory.mktemp("custom-env"), PKG)
    yield python
    proc = subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "areal-agents-sort-digits"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


CHECK = """
from areal_agents import check_env, make_env
from areal_agents.registry import datasets, envs, rewards
print(envs.where("sort-digits"), rewards.where("sort-digits"), datasets.where("sort-digits"))
env = make_env("sort-digits")
check_env(env, actions=["1 2 3", "0 1 2 3"])
reward = rewards.get("sort-digits")
print(reward("2 4 7 9", answer="2 4 7 9"), reward("2 4 9 7", answer="2 4 7 9"), reward("9", answer="2 4 7 9"))
train, test = datasets.get("sort-digits")("train"), datasets.get("sort-digits")("test")
assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
obs, _ = env.reset(options=test[0])
print(obs, "->", env.reference_completion(test[0]), env.step(env.reference_completion(test[0]))[1:3])
"""


def test_entry_points_register_env_reward_dataset(venv_python: str) -> None:
    proc = subprocess.run([venv_python, "-c", CHECK], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    where, rewards_line, step_line = proc.stdout.strip().splitlines()
    assert where == ("sort_digits_env.env:SortDigitsEnv sort_digits_env.rewards:sort_digits_reward "
                     "sort_digits_env.data:sort_digits_dataset")
    assert rewards_line == "1.0 0.25 0.0"
    prompt, rest = step_line.split(" -> ")
    digits = prompt.removeprefix("sort ").split()
    assert rest == " ".join(sorted(digits)) + " (1.0, True)"
    listed = subprocess.run([venv_python, "-m", "areal_agents.cli", "list", "envs"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "COLUMNS": "200"}).stdout
    assert re.search(r"sort-digits\W+sort_digits_env\.env:SortDigitsEnv", listed), listed  # as the README says
    # the interpreter the other tests run in never saw the package
    assert "sort-digits" not in subprocess.run([sys.executable, "-m", "areal_agents.cli", "list", "envs"],
                                               capture_output=True, text=True, timeout=60).stdout


def test_run_trains_the_plugin_env(venv_python: str, tmp_path: Path) -> None:
    run_command(["areal-agents", "run", "--env", "sort-digits", "--config", "examples/custom_env/config.yaml", *TINY,
                 f"output_dir={tmp_path / 'runs'}"], tmp_path, python=venv_python)
    run_dir = tmp_path / "runs" / "sort-digits" / "grpo"
    steps = train_steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["version"] == 2
    samples = (run_dir / "samples.jsonl").read_text()
    assert "sort " in samples  # the plug-in's dataset fed the episodes
    warm = list((tmp_path / "cache" / "warm").glob("sort-digits-*"))
    assert len(warm) == 1 and (warm[0] / "sft_report.json").is_file()  # warm-started from reference_completion
