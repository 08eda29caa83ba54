"""examples/tool_agent: a custom Agent that runs the model's Python in the sandbox, registered and trained."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from examples_support import ROOT, load_example, metrics_rows, run_command

from areal_agents import make_env
from areal_agents.data import arithmetic_dataset
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.rollout.returns import settle_returns

ROW = {"prompt": "37*45=?", "answer": "1665", "expression": "37*45"}


def _load() -> ModuleType:
    return load_example("examples/tool_agent/sandbox_agent.py")


def test_agent_runs_the_tool_in_the_sandbox_then_answers() -> None:
    agent = _load().SandboxToolAgent(max_turns=3)
    llm = ScriptedLLM(["<python>import socket\nprint(37*45)</python>", "1665"])
    traj = settle_returns(asyncio.run(agent.run(make_env("python-tool"), llm, ROW, seed=0)), 0.5)  # env.turn_discount
    assert traj.status == "ok" and traj.info["success"] is True and traj.info["agent_tool_calls"] == 1
    assert llm.messages[2] == {"role": "user", "content": "<output>1665</output>"}  # real sandboxed run
    assert traj.turn_rewards == [0.0, 1.0] and traj.reward == 0.5  # the tool call cost one factor γ
    assert len(traj.turn_spans) == 2 and traj.info["end_reason"] == "terminated"


def test_agent_reports_sandbox_errors_and_caps_tool_calls() -> None:
    agent = _load().SandboxToolAgent(max_turns=4, max_tool_calls=1)
    code = "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)"
    llm = ScriptedLLM([f"<python>{code}</python>", "<python>print(1)</python>", "12"])
    traj = asyncio.run(agent.run(make_env("python-tool", max_turns=2), llm, ROW, seed=0))
    output = llm.messages[2]["content"]
    assert output.startswith("<output>") and "Error" in output  # no network in the sandbox
    # the second call is over the agent's budget: the env runs it as its own tool turn
    assert traj.info["agent_tool_calls"] == 1 and traj.info["tool_calls"] == 1
    assert traj.turn_rewards == [0.0, 0.0, 0.0] and traj.info["success"] is False


@pytest.mark.parametrize("bad", [{"max_turns": 0}, {"max_tokens": 0}, {"max_tool_calls": -1}])
def test_agent_rejects_bad_arguments(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="SandboxToolAgent"):
        _load().SandboxToolAgent(**bad)


def test_reference_turns_show_what_the_sandbox_prints() -> None:
    module = _load()
    agent, env = module.SandboxToolAgent(max_tool_calls=2), make_env("python-tool")
    rows = arithmetic_dataset("train", size=3, ops=["*"], template="{a}{op}{b}=?")
    for row in rows:
        (chat, call), (after, answer) = module.reference_turns(env, agent, row)
        assert chat == [{"role": "user", "content": row["prompt"] + env.hint}] and answer == row["answer"]
        assert after[:-1] == [*chat, {"role": "assistant", "content": call}]
        code = re.fullmatch(r"<python>(.*)</python>", call, re.S).group(1)
        assert after[-1] == {"role": "user", "content": agent.run_tool(code)}  # a real sandbox run prints that


@pytest.mark.parametrize(("arg", "line"), [("actor.lr=-1", "error: actor.lr: must be > 0 (got -1.0)"),
                                           ("--bogus", "areal-agents: error: unrecognized arguments: --bogus")])
def test_script_reports_a_bad_argument_once(tmp_path: Path, arg: str, line: str) -> None:
    proc = subprocess.run([sys.executable, "examples/tool_agent/sandbox_agent.py", "--config",
                           "examples/tool_agent/config.yaml", arg], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AREAL_AGENTS_CACHE": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == line
    assert proc.stderr.count(line) == 1 and not (tmp_path / "warm").exists()  # no warm start began


@pytest.mark.slow  # the example as its README states it, shortened to 2 RL steps on 20 test rows
def test_warm_start_teaches_the_tool_call_and_the_answer(tmp_path: Path) -> None:
    run_command([sys.executable, "examples/tool_agent/sandbox_agent.py", "--config", "examples/tool_agent/config.yaml",
                 "trainer.total_steps=2", "data.test_size=20", "eval.n=20", "logging.progress=false",
                 f"output_dir={tmp_path / 'runs'}"], tmp_path, timeout=900)
    run_dir = tmp_path / "runs" / "tool-agent" / "sandbox-tool"
    assert "name: sandbox-tool" in (run_dir / "config.yaml").read_text()  # the script registered and selected it
    report = json.loads(next((tmp_path / "cache" / "warm").glob("python-tool-sandbox-tool-*/sft_report.json")).read_text())
    target = yaml.safe_load((ROOT / "examples/tool_agent/config.yaml").read_text())["sft"]["warm_start_target"]
    assert report["stopped_early"] and report["evals"][-1]["acc"] >= target  # both turns of that share of test rows
    rows = metrics_rows(run_dir)
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert evals[0] >= target - 0.1, evals  # the same rows served through the agent, with real sandbox runs
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["version"] == 2
    assert all(r["rollout/failed"] == 0 for r in steps)
    assert sum(r["rollout/reward"] for r in steps) > 0  # (the format was never learned before: reward 0 throughout)
