"""examples/openai_agent and docs/byo_agent.md: OpenAI-client agents, registered from a file, trained."""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from examples_support import ROOT, TINY, load_example, run_command, train_steps

from areal_agents.llm.scripted import CharTokenizer, ScriptedLLM
from areal_agents.openai_compat.client import EpisodeClient
from areal_agents.openai_compat.session import ChatSession
from areal_agents.openai_compat.trajectories import assemble
from areal_agents.rollout.returns import settle_returns


def _load() -> ModuleType:
    return load_example("examples/openai_agent/calc_agent.py")


class ToolTemplate(CharTokenizer):
    """The character tokenizer with the tool format of the tiny model's template (tool calls in replies)."""

    def apply_chat_template(self, conversation: Any, tokenize: bool = True, add_generation_prompt: bool = False,
                            **kwargs: Any) -> Any:
        from jinja2 import Environment

        from trainers.tiny_model import CHAT_TEMPLATE
        text = Environment().from_string(CHAT_TEMPLATE).render(messages=conversation, tools=kwargs.get("tools"),
                                                               add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text


def test_calc_agent_calls_the_tool_then_answers() -> None:
    module = _load()
    backend = ScriptedLLM(['<tool_call>{"name": "add", "arguments": {"a": 37, "b": 45}}</tool_call>', "82"],
                          ToolTemplate())

    async def generate(ids: list[int], sampling: dict[str, Any], top: int) -> Any:
        return await backend._generate(ids, sampling)

    session = ChatSession(backend.tokenizer, generate, {"max_new_tokens": 256})  # characters
    reward = asyncio.run(module.calc_agent(EpisodeClient(session), {"prompt": "37+45=", "answer": "82"}))
    assert reward == 1.0 and len(session.records) == 2
    assert "82" in backend.tokenizer.decode(session.records[1].prompt_ids)  # the tool's result reached the model
    [traj] = assemble(session.records, reward)  # the second call extends the first: one trajectory
    settle_returns(traj, 0.9)  # env.turn_discount, applied where the episode ends
    assert traj.num_turns == 2 and traj.turn_returns == [0.9, 1.0]
    assert module.run_tool("add", '{"a": "x"}').startswith("error")


def _block(doc: str, first_line: str) -> str:
    text = (ROOT / doc).read_text(encoding="utf-8")
    [found] = [b for b in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M) if b.startswith(first_line)]
    return found


@pytest.mark.slow
def test_byo_doc_agent_trains_as_written(tmp_path: Path, warm_cache: Callable[[str], Path]) -> None:
    (tmp_path / "my_agent.py").write_text(_block("docs/byo_agent.md", "# my_agent.py"))
    text = (ROOT / "docs" / "byo_agent.md").read_text(encoding="utf-8")
    [command] = re.findall(r"^(areal-agents run --env math agent=my-agent .*)$", text, re.M)
    warm_cache("math-tiny")
    run_command([*shlex.split(command), *TINY, f"output_dir={tmp_path / 'runs'}"], tmp_path, cwd=tmp_path)
    steps = train_steps(tmp_path / "runs" / "math" / "trial")
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/failed"] == 0 for r in steps)


@pytest.mark.slow
def test_byo_doc_http_agent_trains_as_written(tmp_path: Path, warm_cache: Callable[[str], Path]) -> None:
    """The page's official-client agent over HTTP (one client per event loop) trains and evaluates:
    the run calls it on several loops (the one-row check, the rollout process, the evals)."""
    first = "# math_http_agent.py: "
    code = _block("docs/byo_agent.md", first)
    (tmp_path / "math_http_agent.py").write_text(code)
    command = shlex.split(code.splitlines()[0].removeprefix(first))
    warm_cache("math-tiny")
    run_command([*command, *TINY, "eval.every=1", f"output_dir={tmp_path / 'runs'}"], tmp_path, cwd=tmp_path)
    steps = train_steps(tmp_path / "runs" / "math" / "trial")
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/failed"] == 0 for r in steps)


@pytest.mark.slow
def test_example_config_trains(tmp_path: Path, warm_cache: Callable[[str], Path]) -> None:
    warm_cache("math-tiny")
    run_command(["areal-agents", "run", "--config", "examples/openai_agent/config.yaml", *TINY,
                 f"output_dir={tmp_path / 'runs'}"], tmp_path)
    steps = train_steps(tmp_path / "runs" / "openai-agent" / "trial")
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/failed"] == 0 for r in steps)
