"""examples/openai_agents_sdk and examples/langgraph_agent: agents written on the OpenAI Agents SDK
(its Responses model and its chat-completions model) and on LangChain/LangGraph train unchanged
with ``areal-agents run``, as their READMEs say: every step trains, no episode fails, and the run
prints none of the lines of HTTP clients left bound to a finished event loop."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from examples_support import ROOT, TINY, metrics_rows, run_command, train_steps


@pytest.mark.parametrize("example", ["openai_agents_sdk", "langgraph_agent"])
def test_readme_excerpts_are_the_example_code(example: str) -> None:
    readme = (ROOT / "examples" / example / "README.md").read_text(encoding="utf-8")
    code = {line.strip() for line in (ROOT / "examples" / example / "unit_agent.py").read_text().splitlines()}
    excerpts = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
    assert excerpts
    for line in (line.strip() for block in excerpts for line in block.splitlines()):
        assert line in code, line


# What HTTP clients left bound to a closed event loop print when they are closed or collected later.
UNCLEAN = ("Task exception was never retrieved", "Event loop is closed", "Unclosed client session",
           "Unclosed connector", "ResourceWarning", "Task was destroyed but it is pending")

# LangChain keeps one HTTP client per base URL, 128 at most: the check of one row and two evals of
# 72 episodes (before and after RL, each on a loop of its own) ask for more than it keeps, so it
# closes clients of finished loops during the last eval (129 tracebacks in a longer run, when
# every episode had a URL of its own).
LANGGRAPH_EVALS = ["eval.n=72", "sampling.max_new_tokens=24"]


@pytest.mark.slow
@pytest.mark.parametrize("config, extra, name", [
    ("examples/openai_agents_sdk/config.yaml", [], "openai-agents-sdk"),
    ("examples/openai_agents_sdk/config.yaml", ["agent.name=sdk-unit-convert-chat"], "openai-agents-sdk"),
    ("examples/langgraph_agent/config.yaml", LANGGRAPH_EVALS, "langgraph-agent"),
])
def test_framework_example_trains(tmp_path: Path, config: str, extra: list[str], name: str) -> None:
    proc = run_command(["areal-agents", "run", "--config", config, *TINY, *extra, f"output_dir={tmp_path / 'runs'}"],
                       tmp_path, timeout=480, env={"PYTHONWARNINGS": "always::ResourceWarning"})
    run_dir = tmp_path / "runs" / name / "trial"
    steps = train_steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/failed"] == 0 and r["rollout/accepted"] > 0 for r in steps), steps
    evals = [r for r in metrics_rows(run_dir) if "eval/n" in r]
    assert [r["eval/n"] for r in evals] == [72 if extra == LANGGRAPH_EVALS else 4] * 2
    logs = [proc.stdout, proc.stderr, *(p.read_text(errors="replace") for p in (run_dir / "logs").glob("*"))]
    unclean = [line for text in logs for line in text.splitlines() if any(u in line for u in UNCLEAN)]
    assert not unclean, f"{len(unclean)} lines, e.g. {unclean[:3]}"
