"""The ``unit-convert`` env: a task that needs a tool, played through the OpenAI client and through
``ChatAgent`` (env tools), and its reference conversation replayed token for token as a rollout
records it (tool results in the context, never trained)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from areal_agents import ChatAgent, make_env
from areal_agents.config.loader import explain_config, load_config
from areal_agents.llm import Generation
from areal_agents.llm.reference import reference_trajectory
from areal_agents.llm.scripted import ScriptedLLM
from areal_agents.openai_compat.client import EpisodeClient
from areal_agents.openai_compat.session import ChatSession
from areal_agents.openai_compat.trajectories import assemble
from envs.unit_convert import UnitConvertEnv, convert, run_tool, unit_convert_agent, unit_convert_dataset
from trainers.sft import exact_match_accuracy, render_examples
from trainers.tiny_corpus import corpus_text
from trainers.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    env = UnitConvertEnv()
    rows = unit_convert_dataset("train", size=200)
    model = build_tiny_model([corpus_text(env, r) for r in rows], tmp_path_factory.mktemp("uc") / "model")
    return AutoTokenizer.from_pretrained(model)


def test_dataset_splits_and_answers() -> None:
    train, test = unit_convert_dataset("train"), unit_convert_dataset("test")
    assert len(train) == 2000 and len(test) == 500
    key = lambda r: (r["value"], r["from"], r["to"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    assert len({key(r) for r in test}) == 500  # 500 different eval questions
    row = test[0]
    assert row["answer"] == convert(row["value"], row["from"], row["to"]) == run_tool(
        "convert", f'{{"value": {row["value"]}, "from": "{row["from"]}", "to": "{row["to"]}"}}')
    assert convert(37, "mi", "m") == "59545.73" and convert(3, "km", "m") == "3000"
    assert run_tool("convert", '{"value": 1, "from": "kg", "to": "m"}').startswith("error: cannot convert mass")
    assert run_tool("add", "{}").startswith("error") and run_tool("convert", "{").startswith("error")


def test_env_runs_the_tool_then_scores_the_answer() -> None:
    env = make_env("unit-convert")
    row = {"prompt": "How many meters is 37 miles?", "value": 37, "from": "mi", "to": "m", "answer": "59545.73"}
    assert env.reset(options=row)[0] == row["prompt"]
    obs, reward, terminated, _, info = env.step(env.reference_completion(row) or "")
    assert obs == [{"role": "tool", "tool_call_id": "call_0", "content": "59545.73"}] and not terminated
    assert (reward, info["tool_calls"]) == (0.0, 1)
    _, reward, terminated, _, info = env.step("59545.73")
    assert terminated and reward == 1.0 and info["success"] is True
    env.reset(options=row)
    assert env.step("59545.7")[1] == 0.0  # a value not copied exactly is wrong
    env.reset(options=row)
    assert env.step("<tool_call>{bad</tool_call>")[0][0]["content"].startswith("error")


def test_env_defaults_pick_the_openai_agent_and_yield_to_overrides() -> None:
    cfg, sources = explain_config(None, ["env.name=unit-convert"])
    assert cfg.agent.name == "unit-convert" and sources["agent.name"] == "env unit-convert"
    assert cfg.sampling.max_new_tokens == UnitConvertEnv.default_config["sampling"]["max_new_tokens"]
    assert load_config(None, ["env.name=unit-convert", "agent=chat"]).agent.name == "chat"
    assert load_config(None, ["env.name=math"]).agent.name == "chat"  # other envs keep the plain default


def _replayer(tokenizer: Any, replies: list[list[int]]) -> Any:
    """A generate function that samples nothing: it returns the given replies' token ids in turn."""
    async def generate(ids: list[int], sampling: dict[str, Any], top: int) -> Generation:
        out = replies.pop(0)
        return Generation(output_ids=out, logprobs=[-0.5] * len(out), versions=[3] * len(out))
    return generate


def test_reference_conversation_is_what_the_openai_agent_records(tokenizer: Any) -> None:
    env = UnitConvertEnv()
    row = unit_convert_dataset("test", size=3)[1]
    conv = env.reference_conversation(row)
    assert conv is not None
    ref = reference_trajectory(tokenizer, conv, env.tools)
    replies = [ref.input_ids[a:b] for a, b in ref.turn_spans]
    session = ChatSession(tokenizer, _replayer(tokenizer, list(replies)), {"max_new_tokens": 64})
    assert asyncio.run(unit_convert_agent(EpisodeClient(session), dict(row))) is None
    assert len(session.records) == 2  # the tool call, then the answer
    [traj] = assemble(session.records, 1.0)  # the answer's call extends the tool call's: one trajectory
    assert traj.input_ids == ref.input_ids and traj.loss_mask == ref.loss_mask
    (_, first_end), (second, _) = traj.turn_spans
    between = tokenizer.decode(traj.input_ids[first_end:second])
    assert row["answer"] in between and "tool" in between  # the tool's result: context, loss mask 0
    assert not any(traj.loss_mask[first_end:second]) and all(traj.loss_mask[a] for a, _ in traj.turn_spans)
    assert "<tools>" in tokenizer.decode(traj.input_ids[: ref.turn_spans[0][0]])  # tool specs in the prompt
    assert env.reset(options=row) and env.step(session.last_text)[1] == 1.0


def test_warm_start_examples_are_whole_conversations(tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = load_config(None, ["env.name=unit-convert"])
    env = UnitConvertEnv()
    rows = unit_convert_dataset("train", size=6)
    examples, prompts = render_examples(cfg, tokenizer, env, rows)
    assert len(examples) == len(prompts) == 6 and all(e.num_turns == 2 for e in examples)
    assert all(e.input_ids[: len(p)] == p and not any(e.loss_mask[: len(p)]) for e, p in zip(examples, prompts, strict=True))
    model = AutoModelForCausalLM.from_pretrained(Path(tokenizer.name_or_path), dtype=torch.float32)
    assert exact_match_accuracy(model, examples, pad_token_id=0) == 0.0  # an untrained model copies nothing


def test_chat_agent_takes_the_envs_tools_and_parses_calls(tokenizer: Any) -> None:
    env = UnitConvertEnv()
    row = unit_convert_dataset("test", size=1)[0]
    call = env.reference_completion(row)
    llm = ScriptedLLM([call or "", row["answer"]], tokenizer)
    traj = asyncio.run(ChatAgent(max_turns=3).run(env, llm, dict(row)))
    assert traj.status == "ok" and traj.info["success"] is True and traj.info["num_tool_calls"] == 1
    assert traj.num_turns == 2 and traj.turn_rewards == [0.0, 1.0]
    assert "<tools>" in traj.prompt_text  # the env's tool specs were rendered
    (_, first_end), (second, _) = traj.turn_spans
    assert row["answer"] in tokenizer.decode(traj.input_ids[first_end:second])
    assert not any(traj.loss_mask[first_end:second])
    plain = asyncio.run(ChatAgent(max_turns=1).run(make_env("math"), ScriptedLLM(["4"], tokenizer),
                                                   {"prompt": "2+2=", "answer": "4"}))
    assert "num_tool_calls" not in plain.info and "<tools>" not in plain.prompt_text  # no tools, nothing changes
