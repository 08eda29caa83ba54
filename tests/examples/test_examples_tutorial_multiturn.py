"""docs/tutorial_multiturn.md: its code is examples/padlock file for file, the example's own tests pass against
a scripted model, the quoted refusal is the run's, and (slow) its train command learns as the page says."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from examples_support import ROOT, metrics_rows, package_env, run_command
from test_examples_doc_recipes import command

DOC = "docs/tutorial_multiturn.md"
PADLOCK = ROOT / "examples" / "padlock"
QUIET = ["logging.progress=false", "logging.tensorboard=false", "logging.plots=false"]
MARGIN = 0.05  # the least gain of greedy success the slow test accepts (measured: +11.2 to +25.6 points, the page)
TIME_LIMIT_S = 1200  # the train command's time limit in the slow test (measured: 2 min 19 s to 3 min 4 s, the page)


def page_files(text: str) -> dict[str, str]:
    """The files the page's code blocks show: a block whose first line is ``# <path>`` (``<path>:`` and
    a comment may follow) starts a file; an indented block continues the file before it, after a blank line."""
    files: dict[str, str] = {}
    last = None
    for body in re.findall(r"^```(?:python|toml|yaml)\n(.*?)^```", text, re.S | re.M):
        first = body.splitlines()[0]
        if first.startswith(" "):
            assert last is not None, f"a continued block before any file: {first!r}"
            files[last] += "\n" + body
        else:
            last = re.match(r"# ([\w./]+)", first).group(1)
            assert last not in files, f"{last} shown twice"
            files[last] = body
    return files


def package_files() -> dict[str, str]:
    """The example's files that hold code (its README and the empty ``__init__.py`` aside)."""
    paths = [p for p in PADLOCK.rglob("*") if p.is_file() and p.suffix in (".py", ".toml", ".yaml")
             and "__pycache__" not in p.parts and ".egg-info" not in str(p)]
    return {str(p.relative_to(PADLOCK)): p.read_text(encoding="utf-8") for p in paths if p.read_text()}


def test_the_page_s_code_is_the_example_package() -> None:
    shown = page_files((ROOT / DOC).read_text(encoding="utf-8"))
    assert sorted(shown) == sorted(package_files())  # every file shown, no file left out
    for path, body in shown.items():
        assert body == (PADLOCK / path).read_text(encoding="utf-8"), f"{DOC} and examples/padlock/{path} differ"
    assert (PADLOCK / "padlock_game" / "__init__.py").read_text() == ""  # "an empty padlock_game/__init__.py"


def test_the_slow_test_s_bar_is_the_page_s() -> None:
    stated = re.search(r"requires a gain of at least (\d+) points within (\d+) minutes", (ROOT / DOC).read_text())
    assert (int(stated.group(1)), int(stated.group(2))) == (round(MARGIN * 100), TIME_LIMIT_S // 60)


def test_a_changed_line_or_a_missing_block_is_seen() -> None:
    text = (ROOT / DOC).read_text(encoding="utf-8")
    changed = page_files(text.replace("return conv + [", "return conv+[", 1))
    assert changed["padlock_game/env.py"] != (PADLOCK / "padlock_game/env.py").read_text()
    dropped = page_files(re.sub(r"```python\n    # stage 3.*?```\n", "", text, count=1, flags=re.S))
    assert "def reference_conversation" not in dropped["padlock_game/env.py"]


def test_the_example_s_tests_pass_against_a_scripted_model(tmp_path: Path) -> None:
    test_the_page_s_code_is_the_example_package()  # the files run here are the page's blocks
    pkg = tmp_path / "padlock"  # a copy: pytest writes its cache next to the files
    shutil.copytree(PADLOCK, pkg, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    out = run_command(command(DOC, "python -m pytest test_padlock.py"), tmp_path, cwd=pkg).stdout
    assert re.search(r"\b4 passed\b", out), out[-2000:]


def test_the_single_turn_env_opens_only_on_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PADLOCK))
    from padlock_game.once import PadlockOnceEnv

    from areal_agents import check_env

    row = {"prompt": "Open the lock: 3 digits, each 1-3.", "code": "132"}
    check_env(PadlockOnceEnv(), options=row)
    for reply, reward in (("132", 1.0), (" 132\n", 1.0), ("123", 0.0), ("", 0.0)):
        env = PadlockOnceEnv()
        env.reset(seed=0, options=row)
        _, got, terminated, truncated, info = env.step(reply)
        assert (got, terminated, truncated, info["success"]) == (reward, True, False, reward == 1.0), reply


def test_the_quoted_refusal_is_the_run_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PADLOCK))
    from padlock_game import env as padlock_env
    from padlock_game import game

    from areal_agents.config import ConfigError
    from areal_agents.rollout.preflight import check_reference_turns

    text = (ROOT / DOC).read_text(encoding="utf-8")
    digits = re.search(r'with `DIGITS = "(\d+)"` the expert needs up to (\d+)', text)
    quoted = re.search(r"```\n(agent\.max_turns: .*)\n```", text).group(1)
    monkeypatch.setattr(game, "DIGITS", digits.group(1))
    monkeypatch.setattr(padlock_env, "DIGITS", digits.group(1))
    cfg = SimpleNamespace(env=SimpleNamespace(name="padlock"), agent=SimpleNamespace(max_turns=4))
    with pytest.raises(ConfigError) as refused:
        check_reference_turns(cfg, padlock_env.PadlockEnv(), game.padlock_dataset("train"))
    assert str(refused.value) == quoted and f"up to {digits.group(2)} assistant turns" in quoted
    monkeypatch.setattr(game, "DIGITS", "123")
    monkeypatch.setattr(padlock_env, "DIGITS", "123")
    check_reference_turns(cfg, padlock_env.PadlockEnv(), game.padlock_dataset("train"))  # the page's game fits


@pytest.mark.slow
def test_the_tutorial_trains_as_written(tmp_path: Path) -> None:
    """From an empty cache, the page's commands in a fresh environment: the install registers the names,
    check_env passes, and the train command raises greedy success by MARGIN within TIME_LIMIT_S."""
    pkg = tmp_path / "padlock"  # a copy: the editable install writes its egg-info next to the files
    shutil.copytree(PADLOCK, pkg, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    python = package_env(tmp_path, pkg)  # what `pip install -e .` does, in a throw-away environment
    run_command(command(DOC, "python -c"), tmp_path, python=python, cwd=tmp_path)
    run_command([*command(DOC, "areal-agents run --env padlock"), *QUIET], tmp_path, python=python, cwd=tmp_path,
                timeout=TIME_LIMIT_S)
    evals = [r["eval/accuracy"] for r in metrics_rows(tmp_path / "runs" / "padlock" / "trial") if "eval/accuracy" in r]
    assert len(evals) == 3 and evals[-1] >= evals[0] + MARGIN, evals  # before RL, at step 20, after step 40
    report = json.loads(next((tmp_path / "cache" / "warm").glob("padlock-*/sft_report.json")).read_text())
    assert report["reached"] and report["target"] == 0.5
