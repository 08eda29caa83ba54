"""examples/openai_agents_sdk and examples/langgraph_agent: agents written on the OpenAI Agents SDK
(its Responses model and its chat-completions model) and on LangChain/LangGraph train unchanged
with ``areal-agents run``, as their READMEs say: every step trains, no episode fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from examples_support import ROOT, TINY, run_command, train_steps


@pytest.mark.parametrize("example", ["openai_agents_sdk", "langgraph_agent"])
def test_readme_excerpts_are_the_example_code(example: str) -> None:
    readme = (ROOT / "examples" / example / "README.md").read_text(encoding="utf-8")
    code = {line.strip() for line in (ROOT / "examples" / example / "unit_agent.py").read_text().splitlines()}
    excerpts = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
    assert excerpts
    for line in (line.strip() for block in excerpts for line in block.splitlines()):
        assert line in code, line


@pytest.mark.slow
@pytest.mark.parametrize("config, extra, name", [
    ("examples/openai_agents_sdk/config.yaml", [], "openai-agents-sdk"),
    ("examples/openai_agents_sdk/config.yaml", ["agent.name=sdk-unit-convert-chat"], "openai-agents-sdk"),
    ("examples/langgraph_agent/config.yaml", [], "langgraph-agent"),
])
def test_framework_example_trains(tmp_path: Path, config: str, extra: list[str], name: str) -> None:
    run_command(["areal-agents", "run", "--config", config, *extra, *TINY, f"output_dir={tmp_path / 'runs'}"],
                tmp_path, timeout=480)
    steps = train_steps(tmp_path / "runs" / name / "trial")
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/failed"] == 0 and r["rollout/accepted"] > 0 for r in steps), steps
